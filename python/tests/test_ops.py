"""Every operation, byte-exact, with arrays of several dtypes and shapes."""

from __future__ import annotations

import time

import numpy as np
import pytest

import ferry
from conftest import WAIT


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("shape", [(1,), (4097,), (64, 33), (2, 3, 5, 7)])
def test_write_and_read_back_every_dtype_and_shape(pair, dtype, shape):
    rng = np.random.default_rng(7)
    src = (rng.random(shape) * 100).astype(dtype)
    remote = np.zeros(shape, dtype=dtype)
    back = np.zeros(shape, dtype=dtype)
    r_remote = pair.target.register(remote, access=ferry.Access.REMOTE_READ_WRITE)
    r_src, r_back = pair.initiator.register(src), pair.initiator.register(back)
    assert pair.peer.write(r_src, r_remote.descriptor()).wait(WAIT) == src.nbytes
    assert np.array_equal(remote, src)
    assert pair.peer.read(r_back, r_remote.to_string()).wait(WAIT) == src.nbytes
    assert np.array_equal(back, src)


def test_other_buffer_objects_register_without_copy(pair):
    target = bytearray(64)
    region = pair.target.register(target, access=ferry.Access.REMOTE_WRITE)
    view = memoryview(bytearray(b"x" * 64))
    src = pair.initiator.register(view)
    assert src.address == np.frombuffer(view, dtype=np.uint8).ctypes.data  # the same memory
    pair.peer.write(src, region.descriptor(), remote_offset=8, length=16).wait(WAIT)
    assert target == bytes(8) + b"x" * 16 + bytes(40)


def test_offsets_and_lengths_at_odd_places(pair):
    remote = np.zeros(10007, dtype=np.uint8)
    region = pair.target.register(remote, access=ferry.Access.REMOTE_WRITE)
    src = np.arange(10007, dtype=np.uint8)
    r = pair.initiator.register(src)
    pair.peer.write(r, region.descriptor(), local_offset=3, remote_offset=4001, length=999).wait(WAIT)
    expected = np.zeros(10007, dtype=np.uint8)
    expected[4001:5000] = src[3:1002]
    assert np.array_equal(remote, expected)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint32, np.uint64])
def test_page_table_batch_from_integer_arrays(pair, index_dtype):
    blocks, block = 2000, 256
    pool = np.zeros((4096, block), dtype=np.uint8)
    region = pair.target.register(pool, access=ferry.Access.REMOTE_READ_WRITE)
    rng = np.random.default_rng(3)
    cache = rng.integers(0, 256, size=(blocks, block), dtype=np.uint8)
    local = pair.initiator.register(cache)
    src = rng.permutation(blocks).astype(index_dtype)
    dst = rng.choice(4096, size=blocks, replace=False).astype(index_dtype)
    n = pair.peer.write(local, region.descriptor(), local_offset=src * block,
                        remote_offset=dst * block, length=block).wait(WAIT)
    assert n == blocks * block
    assert np.array_equal(pool[dst.astype(np.int64)], cache[src.astype(np.int64)])
    # Per-entry lengths and a strided (non-contiguous) offsets array are accepted too.
    back = np.zeros_like(cache)
    back_region = pair.initiator.register(back)
    every_other = (np.arange(2 * blocks, dtype=np.int64) * (block // 2))[::2]
    lengths = np.full(blocks, block, dtype=np.int64)
    pair.peer.read(back_region, region.descriptor(), local_offset=every_other,
                   remote_offset=dst.astype(np.int64) * block, length=lengths).wait(WAIT)
    assert np.array_equal(back, cache[src.astype(np.int64)])


def test_batch_arguments_are_checked(pair):
    region = pair.target.register(np.zeros(4096, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.zeros(4096, np.uint8))
    d = region.descriptor()
    with pytest.raises(ferry.InvalidArgument, match="differ in length"):
        pair.peer.write(local, d, local_offset=np.arange(3), remote_offset=np.arange(4), length=1)
    with pytest.raises(ferry.InvalidArgument, match="length is required"):
        pair.peer.write(local, d, remote_offset=np.arange(3))
    with pytest.raises(ferry.InvalidArgument, match="negative"):
        pair.peer.write(local, d, remote_offset=np.array([0, -8]), length=8)
    with pytest.raises(ferry.InvalidArgument, match="integers"):
        pair.peer.write(local, d, remote_offset=np.array([0.0, 8.0]), length=8)
    with pytest.raises(ferry.InvalidArgument, match="negative"):
        pair.peer.write(local, d, local_offset=-1)
    with pytest.raises(TypeError, match="descriptor"):
        pair.peer.write(local, 1234)


def test_write_with_imm_notifies_after_every_byte(pair):
    ring = np.zeros((16, 4096), dtype=np.uint8)
    region = pair.target.register(ring, access=ferry.Access.REMOTE_WRITE)
    src = np.repeat(np.arange(1, 17, dtype=np.uint8), 4096)
    local = pair.initiator.register(src)
    for slot in range(16):
        pair.peer.write_with_imm(local, region.descriptor(), slot, local_offset=slot * 4096,
                                 remote_offset=slot * 4096, length=4096)
    seen = []
    for _ in range(16):
        event = pair.target.next_imm(WAIT)
        assert event is not None
        assert event.peer_engine_id == pair.initiator.id
        assert event.peer_incarnation == pair.initiator.incarnation
        assert event.peer_address == pair.target_peer.address
        assert (ring[event.imm] == event.imm + 1).all()
        seen.append(event.imm)
    assert sorted(seen) == list(range(16))
    assert pair.target.next_imm(0.0) is None


def test_prepared_batch_posts_many_times(pair):
    remote = np.zeros(8 * 1024, dtype=np.uint8)
    region = pair.target.register(remote, access=ferry.Access.REMOTE_WRITE)
    src = np.zeros(8 * 1024, dtype=np.uint8)
    local = pair.initiator.register(src)
    prepared = pair.peer.prepare_write(local, region.descriptor(),
                                       local_offset=np.arange(8) * 1024,
                                       remote_offset=np.arange(8)[::-1] * 1024, length=1024)
    for step in range(5):
        src[:] = np.repeat(np.arange(8, dtype=np.uint8) + step, 1024)
        prepared.post().wait(WAIT)
        assert np.array_equal(remote.reshape(8, 1024)[::-1], src.reshape(8, 1024))
    with pytest.raises(ferry.OutOfBounds):
        pair.peer.prepare_write(local, region.descriptor(), remote_offset=8 * 1024 - 1, length=2)
    with pytest.raises(ferry.PermissionDenied):
        pair.peer.prepare_read(local, region.descriptor(), length=8)


def test_prepared_write_with_imm_notifies_every_post(pair):
    region = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.ones(64, np.uint8))
    prepared = pair.peer.prepare_write_with_imm(local, region.descriptor(), 99)
    for _ in range(3):
        prepared.post().wait(WAIT)
    assert [pair.target.next_imm(WAIT).imm for _ in range(3)] == [99, 99, 99]


def test_tagged_send_recv_in_order_both_directions(pair):
    inbox = np.zeros(1 << 16, dtype=np.uint8)
    r_in = pair.target.register(inbox)
    out = np.arange(1 << 16, dtype=np.uint32).view(np.uint8)[: 1 << 16].copy()
    r_out = pair.initiator.register(out)
    sends = [pair.peer.send(5, r_out, offset=i, length=100 + i) for i in range(10)]
    for i in range(10):
        n = pair.target_peer.recv(5, r_in).wait(WAIT)
        assert n == 100 + i
        assert np.array_equal(inbox[:n], out[i:i + n])
    for s in sends:
        s.wait(WAIT)
    # The other direction, over the same connection.
    back = np.zeros(100, dtype=np.uint8)
    r_back = pair.initiator.register(back)
    f = pair.peer.recv(6, r_back)
    pair.target_peer.send(6, r_in, length=50).wait(WAIT)
    assert f.wait(WAIT) == 50 and f.bytes == 50
    assert np.array_equal(back[:50], inbox[:50])
    channels = pair.peer.stats["channels"]
    assert channels[pair.peer.transport]["messages_sent"] == 10
    assert channels[pair.peer.transport]["lanes"] >= 1
    assert sum(c["messages_received"] for c in channels.values()) == 1


def test_stats_say_which_way_large_same_host_writes_went(pair):
    if pair.peer.transport != "shm":
        pytest.skip("the same-host transport chooses between two ways")
    remote = np.zeros(1 << 20, dtype=np.uint8)
    region = pair.target.register(remote, access=ferry.Access.REMOTE_WRITE)
    src = np.zeros(1 << 20, dtype=np.uint8)
    r = pair.initiator.register(src)
    for i in range(16):  # a run of 8 through the rings, then a run of 8 pulled
        src[:] = np.random.default_rng(i).integers(0, 256, size=src.size, dtype=np.uint8)
        pair.peer.write(r, region.descriptor()).wait(WAIT)
        assert np.array_equal(remote, src)
    [writes] = [p for p in pair.peer.stats["paths"] if p["transfers"] == "write"]
    assert writes["from_bytes"] == 1 << 20
    assert writes["bounced"] == 8 and writes["direct"] == 8
    assert writes["bounced_mb_per_s"] > 0 and writes["direct_mb_per_s"] > 0


def test_peer_and_engine_properties(pair):
    assert pair.peer.engine_id == pair.target.id
    assert pair.peer.incarnation == pair.target.incarnation
    assert pair.peer.transport in ("shm", "tcp", "verbs")
    assert pair.peer.reach == "same process"
    routes = pair.peer.routes
    assert [r["operations"] for r in routes] == ["write/read", "write_with_imm", "send/recv"]
    assert all(r["transport"] == pair.peer.transport for r in routes)
    assert all(r["local"] == r["remote"] == "host" for r in routes)
    assert f"{pair.peer.transport}: chosen" in routes[0]["why"]
    assert pair.peer.connected
    assert pair.initiator.address == "" and pair.initiator.addresses == []
    assert pair.target.address.startswith("127.0.0.1:")
    assert ferry.__version__.count(".") == 2
    names = [t["name"] for t in ferry.transports()]
    assert "tcp" in names and "verbs" in names
    assert pair.target.stats["peers"] == 1 and pair.target.stats["pending_handshakes"] == 0


def test_metrics_count_the_operations_and_their_bytes(pair):
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, dtype=np.uint8)
    r_src = pair.initiator.register(src)
    r_dst = pair.target.register(dst, access=ferry.Access.REMOTE_WRITE)
    remote = ferry.Descriptor(r_dst.descriptor())
    for _ in range(3):
        pair.peer.write(r_src, remote, length=1000).wait(WAIT)
    with pytest.raises(ferry.OutOfBounds):
        pair.peer.write(r_src, remote, remote_offset=4000, length=200).wait(WAIT)
    assert np.array_equal(dst[:1000], src[:1000])

    # An operation is counted just after its Future completes.
    deadline = time.monotonic() + WAIT
    while True:
        m = pair.peer.metrics
        counted = sum(sum(op["latency"]) for kinds in m["transports"].values()
                      for name, op in kinds.items() if name != "errors")
        if counted >= 4 or time.monotonic() > deadline:
            break
    assert m["engine_id"] == pair.target.id
    write = m["transports"][pair.peer.transport]["write"]
    assert (write["succeeded"], write["failed"], write["bytes"]) == (3, 1, 3000)
    assert write["in_flight"] == 0 and sum(write["latency"]) == 4 and write["latency_sum_s"] > 0
    assert len(write["latency"]) == len(ferry.LATENCY_BUCKET_BOUNDS_S)
    assert m["transports"][pair.peer.transport]["errors"] == {"out_of_bounds": 1}
    everything = pair.initiator.metrics()
    assert everything["peers"] == [m]
    text = pair.initiator.prometheus()
    assert f'transport="{pair.peer.transport}",kind="write"}} 3000\n' in text

    quiet = ferry.Engine(listen=False, metrics=False)
    assert quiet.metrics()["peers"] == []
