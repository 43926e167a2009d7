"""Every error reaches Python as its own exception class, carrying the library's code."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import WAIT, config


def test_every_code_has_a_class_with_the_right_bases():
    assert set(ferry.errors.BY_CODE) == {
        "in_progress", "invalid_argument", "out_of_bounds", "permission_denied",
        "unknown_region", "revoked", "wrong_key", "stale_incarnation", "wrong_peer",
        "peer_lost", "timeout", "cancelled", "protocol", "version_mismatch", "auth_failed",
        "truncated", "resource_exhausted", "connect_failed", "system", "unsupported",
        "not_found", "already_exists"}
    for code, cls in ferry.errors.BY_CODE.items():
        e = cls(code, "what failed")
        assert isinstance(e, ferry.FerryError)
        assert (e.code, e.message, str(e)) == (code, "what failed", f"{code}: what failed")
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is cls and again.message == "what failed"
    assert issubclass(ferry.Timeout, TimeoutError)
    assert issubclass(ferry.InvalidArgument, ValueError)
    assert issubclass(ferry.PeerLost, ConnectionError)
    assert issubclass(ferry.PermissionDenied, PermissionError)


def test_out_of_bounds_and_permission(pair):
    ro = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_READ)
    local = pair.initiator.register(np.zeros(128, np.uint8))
    with pytest.raises(ferry.OutOfBounds, match="exceeds region length 64") as e:
        pair.peer.read(local, ro.descriptor()).wait(WAIT)
    assert e.value.code == "out_of_bounds"
    with pytest.raises(ferry.PermissionDenied):
        pair.peer.write(local, ro.descriptor(), length=8).wait(WAIT)


def test_revoked_region(pair):
    remote = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_WRITE)
    d = remote.descriptor()
    remote.deregister()
    assert not remote.valid
    local = pair.initiator.register(np.zeros(64, np.uint8))
    with pytest.raises((ferry.Revoked, ferry.UnknownRegion)):
        pair.peer.write(local, d).wait(WAIT)
    with pytest.raises(ferry.Revoked):
        remote.descriptor()


def test_malformed_descriptors(pair):
    local = pair.initiator.register(np.zeros(8, np.uint8))
    with pytest.raises(ferry.InvalidArgument):
        pair.peer.write(local, "not a descriptor")
    good = pair.target.register(np.zeros(8, np.uint8), access=ferry.Access.REMOTE_WRITE)
    blob = bytearray(good.descriptor())
    blob[0] ^= 0xFF  # the version byte
    with pytest.raises((ferry.VersionMismatch, ferry.InvalidArgument)):
        pair.peer.write(local, bytes(blob))


def test_descriptor_of_another_engine(pair):
    other = ferry.Engine(**config())
    try:
        region = other.register(np.zeros(8, np.uint8), access=ferry.Access.REMOTE_WRITE)
        local = pair.initiator.register(np.zeros(8, np.uint8))
        with pytest.raises(ferry.WrongPeer):
            pair.peer.write(local, region.descriptor()).wait(WAIT)
    finally:
        other.shutdown()


def test_timeout_while_running(pair):
    inbox = pair.target.register(np.zeros(8, np.uint8))
    pending = pair.target_peer.recv(1, inbox)
    with pytest.raises(ferry.Timeout):
        pending.wait(0.01)
    assert not pending.done()
    with pytest.raises(ferry.InvalidArgument):
        pending.wait(-1.0)
    with pytest.raises(ferry.InProgress):
        pending.exception()
    # Complete it: a region with a receive still posted cannot be deregistered (the engine
    # waits for the receive; issue: a bound on revocation).
    pair.peer.send(1, pair.initiator.register(np.ones(8, np.uint8))).wait(WAIT)
    assert pending.wait(WAIT) == 8


def test_truncated_message(pair):
    small = pair.target.register(np.zeros(4, np.uint8))
    big = pair.initiator.register(np.zeros(64, np.uint8))
    recv = pair.target_peer.recv(2, small)
    send = pair.peer.send(2, big)
    with pytest.raises(ferry.Truncated):
        recv.wait(WAIT)
    with pytest.raises(ferry.Truncated):
        send.wait(WAIT)


def test_peer_lost_and_cancelled(pair):
    inbox = pair.initiator.register(np.zeros(8, np.uint8))
    pending = pair.peer.recv(3, inbox)
    pair.target.shutdown()
    with pytest.raises((ferry.PeerLost, ferry.Cancelled)):
        pending.wait(WAIT)
    with pytest.raises(ferry.PeerLost):
        pair.peer.send(3, inbox).wait(WAIT)
    assert isinstance(pair.peer.send(3, inbox).exception(), ferry.PeerLost)


def test_closing_a_peer_cancels_its_work(pair):
    inbox = pair.initiator.register(np.zeros(8, np.uint8))
    pending = pair.peer.recv(3, inbox)
    pair.peer.close()
    with pytest.raises(ferry.Cancelled):
        pending.wait(WAIT)


def test_connect_failed_and_auth_failed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there once closed
    lonely = ferry.Engine(**config(listen=False))
    with pytest.raises(ferry.ConnectFailed):
        lonely.connect(f"127.0.0.1:{port}")
    guarded = ferry.Engine(**config(secret="right"))
    wrong = ferry.Engine(**config(listen=False, secret="wrong"))
    try:
        with pytest.raises(ferry.AuthFailed):
            wrong.connect(guarded.address)
    finally:
        for e in (lonely, guarded, wrong):
            e.shutdown()


def test_an_identity_file_keeps_the_id_and_trusted_keys_admit_only_its_key(tmp_path):
    path = str(tmp_path / "identity.pem")
    first = ferry.Engine(**config(listen=False, identity_file=path))
    first_id, first_key = first.id, first.public_key
    first.shutdown()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    again = ferry.Engine(**config(listen=False, identity_file=path))
    server = ferry.Engine(**config(trusted_keys=[first_key]))
    stranger = ferry.Engine(**config(listen=False))
    try:
        assert (again.id, again.public_key) == (first_id, first_key)
        assert again.incarnation != 0
        peer = again.connect(server.address)
        assert peer.public_key == server.public_key
        accepted = server.accept(WAIT)
        assert accepted is not None
        assert (accepted.engine_id, accepted.public_key) == (first_id, first_key)
        with pytest.raises(ferry.AuthFailed, match="trusted_keys"):
            stranger.connect(server.address)
    finally:
        for e in (again, server, stranger):
            e.shutdown()
    with pytest.raises(ferry.InvalidArgument, match="trusted_keys"):
        ferry.Engine(**config(trusted_keys=["not a key"]))


def test_max_peers_refuses_with_resource_exhausted():
    server = ferry.Engine(**config(max_peers=1))
    first = ferry.Engine(**config(listen=False))
    second = ferry.Engine(**config(listen=False))
    try:
        first.connect(server.address)
        with pytest.raises(ferry.ResourceExhausted):
            second.connect(server.address)
        assert server.stats["refused_connections"] >= 1
    finally:
        for e in (server, first, second):
            e.shutdown()


def test_bad_configuration():
    with pytest.raises(ferry.InvalidArgument):
        ferry.Engine(progress_threads=0)
    with pytest.raises(ferry.InvalidArgument, match="unknown transport"):
        ferry.Engine(transports=["carrier-pigeon"])
    with pytest.raises(ferry.InvalidArgument):
        ferry.Engine(peer_timeout=-1.0)
    with pytest.raises(TypeError):
        ferry.Engine(no_such_setting=1)


def test_rejected_memory():
    with ferry.Engine(**config(listen=False)) as engine:
        with pytest.raises(ferry.InvalidArgument, match="not contiguous"):
            engine.register(np.zeros((8, 8))[:, 1])
        with pytest.raises(ferry.InvalidArgument, match="read-only"):
            engine.register(b"immutable", access=ferry.Access.REMOTE_WRITE)
        frozen = np.zeros(8, np.uint8)
        frozen.flags.writeable = False
        with pytest.raises(ferry.InvalidArgument, match="read-only"):
            engine.register(frozen, access=ferry.Access.REMOTE_READ_WRITE)
        readable = engine.register(frozen, access=ferry.Access.REMOTE_READ)
        assert readable.read_only
        with pytest.raises(TypeError, match="buffer protocol"):
            engine.register(12345)
        with pytest.raises(ferry.InvalidArgument):
            engine.register(bytearray())  # zero length


def test_read_only_memory_cannot_receive(pair):
    remote = pair.target.register(np.zeros(8, np.uint8), access=ferry.Access.REMOTE_READ)
    source = pair.initiator.register(b"12345678")
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        pair.peer.read(source, remote.descriptor())
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        pair.peer.recv(1, source)
    remote_w = pair.target.register(np.zeros(8, np.uint8), access=ferry.Access.REMOTE_WRITE)
    pair.peer.write(source, remote_w.descriptor()).wait(WAIT)  # as a source it is fine


def test_memory_where_a_region_goes_is_a_type_error_naming_the_parameter(pair):
    remote = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_READ_WRITE)
    d = remote.descriptor()
    for raw in (np.zeros(64, np.uint8), bytearray(64)):
        calls = {
            "write": lambda: pair.peer.write(raw, d),
            "read": lambda: pair.peer.read(raw, d),
            "write_with_imm": lambda: pair.peer.write_with_imm(raw, d, 1),
            "prepare_write": lambda: pair.peer.prepare_write(raw, d),
            "prepare_read": lambda: pair.peer.prepare_read(raw, d),
            "prepare_write_with_imm": lambda: pair.peer.prepare_write_with_imm(raw, d, 1),
        }
        for name, call in calls.items():
            with pytest.raises(TypeError, match=rf"^{name}\(\): local must be a ferry.Region"):
                call()
        for name, call in {"send": lambda: pair.peer.send(1, raw),
                           "recv": lambda: pair.peer.recv(1, raw)}.items():
            with pytest.raises(TypeError, match=rf"^{name}\(\): region must be a ferry.Region"):
                call()
    # Nothing was posted: the peer still works.
    local = pair.initiator.register(np.ones(64, np.uint8))
    pair.peer.write(local, d).wait(WAIT)


def test_ctrl_c_ends_every_blocking_call(pair):
    # SIGINT from another thread, as Ctrl-C: each call raises KeyboardInterrupt long before its
    # timeout, instead of sleeping it out with the GIL released.
    region = pair.initiator.register(np.zeros(64, np.uint8))
    never = pair.peer.recv(77, region)  # nobody sends tag 77
    silent = socket.create_server(("127.0.0.1", 0))  # takes the connection, never answers
    patient = ferry.Engine(**{**config(listen=False), "connect_timeout": 60.0})
    calls = {
        "Future.wait": lambda: never.wait(60.0),
        "Engine.next_imm": lambda: pair.target.next_imm(60.0),
        "Engine.accept": lambda: pair.target.accept(60.0),
        "Engine.connect": lambda: patient.connect(f"127.0.0.1:{silent.getsockname()[1]}"),
    }
    # Python leaves SIGINT ignored when its parent ignored it (a job started in the background
    # by a shell without job control, as `make test &`): Ctrl-C's handler, for this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for name, call in calls.items():
            timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
            started = time.monotonic()
            timer.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    call()
            finally:
                timer.join()
            assert time.monotonic() - started < 30.0, f"{name} slept out its timeout"
    finally:
        signal.signal(signal.SIGINT, previous)
    # The engine whose connect was stopped is not shut down by it.
    assert patient.connect(pair.target.address).connected
    patient.shutdown()
    silent.close()


# Two engines in one process, connected over the transport argv[1] names: the initiator's
# region `source` holds argv[2] random bytes `mine`, the target's `granted` (descriptor `d`) as
# many zeros `theirs`, which the initiator may write. The scripts below go on from here.
PAIR_SCRIPT = r"""
import sys

import numpy as np

import ferry

options = dict(peer_timeout=5.0, connect_timeout=5.0, wait_spin=0.0, transports=[sys.argv[1]])
target = ferry.Engine(**options)
initiator = ferry.Engine(**options)
peer = initiator.connect(target.address)
target_peer = target.accept(20.0)
assert target_peer is not None
size = int(sys.argv[2])
mine = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
theirs = np.zeros(size, np.uint8)
source = initiator.register(mine)
granted = target.register(theirs, access=ferry.Access.REMOTE_WRITE)
d = granted.descriptor()
"""


def run_script(body: str, transport: str, size: int) -> None:
    # In a process of its own: the interpreter must exit too.
    run = subprocess.run([sys.executable, "-c", PAIR_SCRIPT + body, transport, str(size)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


CALLBACK_SCRIPT = r"""
import threading
import time

part = len(mine) // 8

said = {}
refused = threading.Event()
stopped = threading.Event()


def deregister_in_callback(_future):
    try:
        source.deregister()
        said["deregister"] = "returned"
    except ferry.InvalidArgument as e:
        said["deregister"] = str(e)
    refused.set()


def shutdown_in_callback(_future):
    initiator.shutdown()
    stopped.set()


first = peer.write(source, d, length=4096)
first.add_done_callback(deregister_in_callback)
others = [peer.write(source, d, length=part, local_offset=i * part, remote_offset=i * part)
          for i in range(8)]
assert refused.wait(20.0), "deregister in a callback did not return"
assert "completion callback" in said["deregister"], said
for f in others:
    f.wait(20.0)
assert (theirs == mine).all()
# A region whose last reference goes in a callback, with writes from it in flight (their
# Futures dropped): they still complete, from memory held until they have.
holder = [initiator.register(mine[::-1].copy())]
dropped = threading.Event()


def drop_in_callback(_future):
    holder.clear()
    dropped.set()


theirs[:] = 0
note = initiator.register(np.zeros(8, np.uint8))
peer.recv(3, note).add_done_callback(drop_in_callback)
for i in range(8):
    peer.write(holder[0], d, length=part, local_offset=i * part, remote_offset=i * part)
target_peer.send(3, target.register(np.ones(8, np.uint8))).wait(20.0)
assert dropped.wait(20.0), "the callback did not finish"
deadline = time.monotonic() + 20.0
while not (theirs == mine[::-1]).all() and time.monotonic() < deadline:
    time.sleep(0.01)
assert (theirs == mine[::-1]).all()

# Shutdown from a callback returns, and ends the operations still in flight.
last = peer.write(source, d, length=4096)
last.add_done_callback(shutdown_in_callback)
more = [peer.write(source, d, length=part) for _ in range(8)]
assert stopped.wait(20.0), "shutdown in a callback did not return"
for f in more:
    try:
        f.wait(20.0)
    except (ferry.Cancelled, ferry.PeerLost):
        pass
print("ok", flush=True)
# Exit with the target still running: the exit hook shuts it down.
"""


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_deregister_and_shutdown_from_a_callback_neither_hang_nor_stop_the_rest(transport):
    run_script(CALLBACK_SCRIPT, transport, 1 << 20)


FORK_SCRIPT = r"""
import multiprocessing
import os


def use_inherited(results):
    for name, call in {
        "write": lambda: peer.write(source, d),
        "connect": lambda: initiator.connect(target.address),
        "shutdown": lambda: initiator.shutdown(),
        "deregister": lambda: source.deregister(),
    }.items():
        try:
            call()
            results.put(name + " worked")
        except ferry.InvalidArgument as e:
            results.put(name + (" refused" if "forked" in str(e) else " said " + str(e)))


# multiprocessing's fork start method, as on Linux by default before Python 3.14.
context = multiprocessing.get_context("fork")
results = context.Queue()
child = context.Process(target=use_inherited, args=(results,))
child.start()
child.join(60)
assert child.exitcode == 0, child.exitcode
said = sorted(results.get(timeout=5) for _ in range(4))
assert said == ["connect refused", "deregister refused", "shutdown refused", "write refused"], said

# A child that exits through the interpreter's own exit: the exit hook and the objects'
# destructors run there.
pid = os.fork()
if pid == 0:
    del peer, source
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status

# The parent's connection is untouched.
assert peer.connected and target_peer.connected
peer.write(source, d).wait(20.0)
assert (theirs == mine).all()
print("ok", flush=True)
"""


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_forked_children_find_inherited_engines_inert_and_the_parent_goes_on(transport):
    run_script(FORK_SCRIPT, transport, 1 << 16)
