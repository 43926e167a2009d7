"""The fast paths: ferry.Descriptor (decoded once), single entries without allocation, page-table
batches read through typed pointers into a reused per-thread buffer. Each must move the same
bytes and raise the same errors as the paths it shortcuts."""

from __future__ import annotations

import gc
import pickle
import sys
import threading
import weakref

import numpy as np
import pytest

import ferry
from conftest import WAIT


def test_descriptor_round_trips_and_compares(pair):
    region = pair.target.register(np.zeros(4096, np.uint8), access=ferry.Access.REMOTE_READ)
    blob = region.descriptor()
    d = ferry.Descriptor(blob)
    assert d.to_bytes() == blob and bytes(d) == blob
    assert d.to_string() == region.to_string()
    assert ferry.Descriptor(region.to_string()) == d
    assert hash(ferry.Descriptor(blob)) == hash(d)
    assert d != blob  # a Descriptor equals only Descriptors
    assert d.size == 4096 and d.engine_id == pair.target.id
    assert d.access == ferry.Access.REMOTE_READ
    assert pickle.loads(pickle.dumps(d)) == d
    assert "ferry1:" in repr(d)
    other = pair.target.register(np.zeros(8, np.uint8), access=ferry.Access.REMOTE_READ)
    assert ferry.Descriptor(other.descriptor()) != d


def test_descriptor_refuses_malformed_input():
    with pytest.raises(ferry.InvalidArgument):
        ferry.Descriptor(b"\x00\x01")
    with pytest.raises(ferry.InvalidArgument):
        ferry.Descriptor("ferry1:!!")
    with pytest.raises(TypeError):
        ferry.Descriptor(1234)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        class Sub(ferry.Descriptor):  # type: ignore[misc]  (final: an exact type check finds it)
            pass


@pytest.mark.parametrize("form", ["object", "bytes", "str"])
def test_every_operation_takes_every_descriptor_form(pair, form):
    remote = np.zeros(8192, np.uint8)
    region = pair.target.register(remote, access=ferry.Access.REMOTE_READ_WRITE)
    d = {"object": ferry.Descriptor(region.descriptor()), "bytes": region.descriptor(),
         "str": region.to_string()}[form]
    src = np.arange(8192, dtype=np.uint64).astype(np.uint8)
    back = np.zeros(8192, np.uint8)
    r_src, r_back = pair.initiator.register(src), pair.initiator.register(back)
    assert pair.peer.write(r_src, d, length=8).wait(WAIT) == 8
    assert np.array_equal(remote[:8], src[:8]) and not remote[8:].any()
    assert pair.peer.write(r_src, d, local_offset=100, remote_offset=5000, length=77).wait(WAIT) == 77
    assert np.array_equal(remote[5000:5077], src[100:177])
    assert pair.peer.write(r_src, d).wait(WAIT) == 8192  # length: the rest of the local region
    assert np.array_equal(remote, src)
    assert pair.peer.read(r_back, d, local_offset=10, remote_offset=20, length=30).wait(WAIT) == 30
    assert np.array_equal(back[10:40], src[20:50])
    pair.peer.write_with_imm(r_src, d, 7, length=16).wait(WAIT)
    event = pair.target.next_imm(WAIT)
    assert event is not None and event.imm == 7
    prepared = pair.peer.prepare_read(r_back, d, length=4096)
    back[:] = 0
    for _ in range(3):
        assert prepared.post().wait(WAIT) == 4096
    assert np.array_equal(back[:4096], src[:4096])
    # Errors are the same through every form.
    with pytest.raises(ferry.OutOfBounds):
        pair.peer.write(r_src, d, remote_offset=8190, length=8).wait(WAIT)
    with pytest.raises(ferry.InvalidArgument, match="negative"):
        pair.peer.write(r_src, d, remote_offset=np.array([0, -8]), length=8)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint32, np.uint64])
@pytest.mark.parametrize("strided", [False, True])
def test_batch_columns_from_every_dtype_and_stride(pair, index_dtype, strided):
    n, block = 3000, 16
    pool = np.zeros(n * block, np.uint8)
    region = pair.target.register(pool, access=ferry.Access.REMOTE_WRITE)
    d = ferry.Descriptor(region.descriptor())
    rng = np.random.default_rng(11)
    src = rng.integers(0, 256, size=n * block, dtype=np.uint8)
    local = pair.initiator.register(src)
    slots = rng.permutation(n)
    offsets = (slots * block).astype(index_dtype)
    lengths = rng.integers(1, block + 1, size=n).astype(index_dtype)
    if strided:
        offsets = np.repeat(offsets, 2)[::2]
        lengths = np.repeat(lengths, 3)[::3]
        assert not offsets.flags.c_contiguous or offsets.strides[0] != offsets.itemsize
    local_offsets = np.arange(n, dtype=index_dtype) * block
    moved = pair.peer.write(local, d, local_offset=local_offsets, remote_offset=offsets,
                            length=lengths).wait(WAIT)
    assert moved == int(lengths.astype(np.int64).sum())
    expected = np.zeros_like(pool)
    for i in range(n):
        s, ln = int(slots[i]), int(lengths[i])
        expected[s * block:s * block + ln] = src[i * block:i * block + ln]
    assert np.array_equal(pool, expected)


def test_batch_negative_entry_is_named_and_nothing_moves(pair):
    pool = np.zeros(1 << 16, np.uint8)
    region = pair.target.register(pool, access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.ones(1 << 16, np.uint8))
    offsets = np.arange(1000, dtype=np.int64) * 8
    offsets[637] = -8
    for column in ("local_offset", "remote_offset", "length"):
        kwargs = {"local_offset": 0, "remote_offset": 0, "length": 8, column: offsets}
        with pytest.raises(ferry.InvalidArgument, match=rf"{column}\[637\] is negative"):
            pair.peer.write(local, region.descriptor(), **kwargs)
    with pytest.raises(ferry.InvalidArgument, match=r"remote_offset\[1\] is negative"):
        pair.peer.write(local, region.descriptor(), remote_offset=np.array([0, -1], np.int32),
                        length=8)
    assert not pool.any()
    # Unsigned arrays cannot be negative: huge values fail the bounds check instead.
    with pytest.raises(ferry.OutOfBounds):
        pair.peer.write(local, region.descriptor(), remote_offset=np.array([2**63], np.uint64),
                        length=8).wait(WAIT)


def test_batch_wrong_arrays_get_clear_errors(pair):
    region = pair.target.register(np.zeros(4096, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.zeros(4096, np.uint8))
    d = ferry.Descriptor(region.descriptor())
    with pytest.raises(ferry.InvalidArgument, match="32- or 64-bit integers"):
        pair.peer.write(local, d, remote_offset=np.arange(4, dtype=np.int16), length=8)
    with pytest.raises(ferry.InvalidArgument, match="32- or 64-bit integers"):
        pair.peer.write(local, d, remote_offset=np.arange(4, dtype=np.float64), length=8)
    with pytest.raises(ferry.InvalidArgument, match="1-D integer array"):
        pair.peer.write(local, d, remote_offset=np.zeros((2, 2), np.int64), length=8)
    with pytest.raises(ferry.InvalidArgument, match="1-D integer array"):
        pair.peer.write(local, d, remote_offset=[0, 8], length=8)
    with pytest.raises(ferry.InvalidArgument, match="empty batch"):
        pair.peer.write(local, d, remote_offset=np.array([], np.int64), length=8)
    with pytest.raises(ferry.InvalidArgument, match="too large"):
        pair.peer.write(local, d, remote_offset=2**64, length=8)
    with pytest.raises(TypeError, match="descriptor"):
        pair.peer.write(local, region, length=8)  # a Region is not a descriptor


def test_batches_of_different_sizes_reuse_nothing_stale(pair):
    """The per-thread buffer is reused: a small batch after a large one moves only its own."""
    pool = np.zeros(1 << 16, np.uint8)
    region = pair.target.register(pool, access=ferry.Access.REMOTE_WRITE)
    d = ferry.Descriptor(region.descriptor())
    local = pair.initiator.register(np.full(1 << 16, 9, np.uint8))
    big = np.arange(4000, dtype=np.int64) * 16
    assert pair.peer.write(local, d, local_offset=big, remote_offset=big, length=4).wait(WAIT) \
        == 16000
    pool[:] = 0
    small = np.array([32, 64], np.int64)
    assert pair.peer.write(local, d, local_offset=small, remote_offset=small, length=4).wait(WAIT) \
        == 8
    assert np.flatnonzero(pool).tolist() == [32, 33, 34, 35, 64, 65, 66, 67]


def test_batch_posted_from_a_completion_callback(pair):
    """A callback may post a batch on the thread that is itself posting one (nested use of the
    per-thread buffer)."""
    pool = np.zeros(1 << 16, np.uint8)
    region = pair.target.register(pool, access=ferry.Access.REMOTE_WRITE)
    d = ferry.Descriptor(region.descriptor())
    local = pair.initiator.register(np.full(1 << 16, 5, np.uint8))
    inner: list[ferry.Future] = []
    done = threading.Event()

    def again(_):
        offsets = np.arange(100, dtype=np.int64) * 64 + 8192
        inner.append(pair.peer.write(local, d, local_offset=offsets, remote_offset=offsets,
                                     length=64))
        done.set()

    outer_offsets = np.arange(100, dtype=np.int64) * 64
    for _ in range(20):
        f = pair.peer.write(local, d, local_offset=outer_offsets, remote_offset=outer_offsets,
                            length=64)
        f.add_done_callback(again)
        f.wait(WAIT)
        assert done.wait(WAIT)
        done.clear()
    for f in inner:
        assert f.wait(WAIT) == 6400
    assert (pool[:6400] == 5).all() and (pool[8192:8192 + 6400] == 5).all()
    assert not pool[6400:8192].any()


def test_threads_post_batches_at_once(pair):
    pool = np.zeros(8 * 4096, np.uint8)
    region = pair.target.register(pool, access=ferry.Access.REMOTE_WRITE)
    d = ferry.Descriptor(region.descriptor())
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            src = pair.initiator.register(np.full(4096, k + 1, np.uint8))
            offs = np.arange(64, dtype=np.int64) * 64
            for _ in range(50):
                pair.peer.write(src, d, local_offset=offs, remote_offset=offs + k * 4096,
                                length=64).wait(WAIT)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all((pool[k * 4096:(k + 1) * 4096] == k + 1).all() for k in range(8))


def test_futures_hold_their_region_and_release_everything(pair):
    region = pair.target.register(np.zeros(1 << 20, np.uint8), access=ferry.Access.REMOTE_WRITE)
    d = ferry.Descriptor(region.descriptor())
    src = np.ones(1 << 20, np.uint8)
    src_ref = weakref.ref(src)
    local = pair.initiator.register(src)
    del src
    before_d, before_local = sys.getrefcount(d), sys.getrefcount(local)
    futures = [pair.peer.write(local, d, length=8) for _ in range(100)]
    prepared = pair.peer.prepare_write(local, d, length=8)
    futures += [prepared.post() for _ in range(10)]
    assert sys.getrefcount(local) == before_local + 111  # each future and the prepared batch
    assert sys.getrefcount(d) == before_d  # the descriptor is only read during the call
    for f in futures:
        assert f.wait(WAIT) == 8
    del futures, f, prepared
    gc.collect()
    assert sys.getrefcount(local) == before_local
    assert sys.getrefcount(d) == before_d
    # The last holder of the region releases the registered array.
    future = pair.peer.write(local, d, length=8)
    del local
    gc.collect()
    assert src_ref() is not None
    future.wait(WAIT)
    del future
    gc.collect()
    assert src_ref() is None
