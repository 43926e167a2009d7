"""Objects keep their parents alive, so any teardown order is safe, also at interpreter exit."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref

import numpy as np

import ferry
from conftest import WAIT, config


def test_region_keeps_its_object_and_engine_alive():
    engine = ferry.Engine(**config(listen=False))
    data = np.zeros(4096, np.uint8)
    data_ref, engine_ref = weakref.ref(data), weakref.ref(engine)
    region = engine.register(data)
    del data, engine
    gc.collect()
    assert data_ref() is not None and engine_ref() is not None
    assert region.obj is data_ref()
    region.deregister()
    assert region.obj is None
    del region
    gc.collect()
    assert data_ref() is None and engine_ref() is None


def test_registered_bytearray_cannot_be_resized_while_registered():
    with ferry.Engine(**config(listen=False)) as engine:
        buf = bytearray(64)
        region = engine.register(buf)
        try:
            buf.extend(b"x")
            raise AssertionError("resized under a registration")
        except BufferError:
            pass
        region.deregister()
        buf.extend(b"x")  # released with the registration


def test_future_keeps_peer_and_regions_alive(pair):
    remote = np.zeros(1 << 20, np.uint8)
    r = pair.target.register(remote, access=ferry.Access.REMOTE_WRITE)
    src = np.ones(1 << 20, np.uint8)
    src_ref = weakref.ref(src)
    future = pair.peer.write(pair.initiator.register(src), r.descriptor())
    del src
    gc.collect()
    assert src_ref() is not None  # the in-flight write still holds its source
    future.wait(WAIT)
    assert remote.all()
    del future
    gc.collect()
    assert src_ref() is None


def test_teardown_in_any_order():
    for order in ("engine-first", "region-first", "peer-first"):
        target = ferry.Engine(**config())
        initiator = ferry.Engine(**config(listen=False))
        region = target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_WRITE)
        peer = initiator.connect(target.address)
        local = initiator.register(np.ones(64, np.uint8))
        pending = peer.write(local, region.descriptor())
        objects = {"engine-first": [target, initiator, peer, region, local, pending],
                   "region-first": [region, local, pending, peer, target, initiator],
                   "peer-first": [peer, pending, target, region, initiator, local]}[order]
        del target, initiator, region, peer, local, pending
        while objects:
            objects.pop(0)
            gc.collect()


def test_shutdown_then_use_fails_cleanly(pair):
    local = pair.initiator.register(np.zeros(8, np.uint8))
    pair.initiator.shutdown()
    pair.initiator.shutdown()  # idempotent
    try:
        pair.peer.send(1, local).wait(WAIT)
        raise AssertionError("a send after shutdown succeeded")
    except (ferry.PeerLost, ferry.Cancelled):
        pass


def test_interpreter_exit_with_work_and_callbacks_pending():
    script = textwrap.dedent("""
        import numpy as np, ferry
        target = ferry.Engine()
        initiator = ferry.Engine(listen=False)
        peer = initiator.connect(target.address)
        inbox = initiator.register(np.zeros(8, np.uint8))
        pending = [peer.recv(1, inbox) for _ in range(4)]  # never matched
        for f in pending:
            f.add_done_callback(lambda f: print("callback", type(f.exception()).__name__))
        target.on_imm(lambda e: None)
        print("exiting")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "exiting" in done.stdout
    # Shutdown failed the pending receives (Cancelled, or PeerLost when the target's engine went
    # first); their callbacks ran before the interpreter left.
    outcomes = [line for line in done.stdout.splitlines() if line.startswith("callback")]
    assert len(outcomes) == 4, done.stdout + done.stderr
    assert all(o in ("callback Cancelled", "callback PeerLost") for o in outcomes), outcomes


def test_allocated_memory_outlives_its_region_through_its_array(pair):
    size = (1 << 20) + 3
    region = pair.target.allocate(size, access=ferry.Access.REMOTE_READ_WRITE)
    array = region.obj
    assert isinstance(array, np.ndarray) and array.dtype == np.uint8 and array.shape == (size,)
    assert array.ctypes.data == region.address and not array.any()  # its memory, zeroed
    source = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
    pair.peer.write(pair.initiator.register(source), region.descriptor()).wait(WAIT)
    assert np.array_equal(array, source)
    region.deregister()
    assert region.obj is None and not region.valid
    del region
    gc.collect()
    assert np.array_equal(array, source)  # the array still holds the memory
    array[:] = 3
    assert int(array.sum()) == 3 * size
