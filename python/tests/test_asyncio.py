"""Futures are awaitable and notifications arrive through `async for`; nothing polls."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import WAIT, config


def test_await_operations(pair):
    remote = np.zeros(64 * 1024, np.uint8)
    region = pair.target.register(remote, access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.full(64 * 1024, 9, np.uint8))

    async def main():
        one = await pair.peer.write(local, region.descriptor(), length=1024)
        many = await asyncio.gather(*(
            pair.peer.write(local, region.descriptor(), local_offset=i * 1024,
                            remote_offset=i * 1024, length=1024) for i in range(64)))
        return one, many

    one, many = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert one == 1024 and many == [1024] * 64
    assert (remote == 9).all()


def test_await_raises_the_operations_error(pair):
    region = pair.target.register(np.zeros(8, np.uint8), access=ferry.Access.REMOTE_READ)
    local = pair.initiator.register(np.zeros(8, np.uint8))

    async def main():
        await pair.peer.write(local, region.descriptor())

    with pytest.raises(ferry.PermissionDenied):
        asyncio.run(asyncio.wait_for(main(), WAIT))


def test_a_cancelled_await_leaves_the_loop_healthy(pair):
    inbox = pair.target.register(np.zeros(8, np.uint8))

    async def main():
        pending = pair.target_peer.recv(9, inbox)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(_aw(pending), 0.05)
        # The receive goes on; a message completes it later.
        source = pair.initiator.register(np.ones(8, np.uint8))
        await pair.peer.send(9, source)
        assert pending.wait(WAIT) == 8

    asyncio.run(main())


def test_completions_come_in_batches_one_wake_up_for_many(pair):
    import select

    remote = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.ones(64, np.uint8))
    completions = ferry._ferry.Completions()
    fd = completions.fileno()
    assert select.select([fd], [], [], 0)[0] == []
    # Futures already complete are queued as they are watched: 16 of them, one eventfd write.
    futures = [pair.peer.write(local, remote.descriptor(), length=8) for _ in range(16)]
    for future in futures:
        future.wait(WAIT)
    for token, future in enumerate(futures):
        completions.watch(future, token)
    assert select.select([fd], [], [], 0)[0] == [fd]
    assert completions.drain() == list(range(16))
    # Drained: nothing is left to read until the next completion.
    assert select.select([fd], [], [], 0)[0] == []
    assert completions.drain() == []
    # One completed on a Ferry thread while watched wakes the reader too.
    inbox = pair.target.register(np.zeros(8, np.uint8))
    pending = pair.target_peer.recv(4, inbox)
    completions.watch(pending, 99)
    assert select.select([fd], [], [], 0)[0] == []
    pair.peer.send(4, local, length=8).wait(WAIT)
    assert select.select([fd], [], [], WAIT)[0] == [fd]
    assert completions.drain() == [99]
    assert pending.done()


def test_awaits_settle_on_their_own_loops(pair):
    target_bytes = np.zeros(1 << 16, np.uint8)
    source_bytes = np.random.default_rng(1).integers(0, 256, 1 << 16, dtype=np.uint8)
    remote = pair.target.register(target_bytes, access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(source_bytes)

    async def writes(base):
        return await asyncio.gather(*(
            pair.peer.write(local, remote.descriptor(), local_offset=base + i * 64,
                            remote_offset=base + i * 64, length=64) for i in range(128)))

    results = {}

    def run(base):
        results[base] = asyncio.run(asyncio.wait_for(writes(base), WAIT))

    threads = [threading.Thread(target=run, args=(base,)) for base in (0, 8192, 16384, 24576)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 8192, 16384, 24576]
    assert all(r == [64] * 128 for r in results.values())
    assert (target_bytes[:32768] == source_bytes[:32768]).all()
    # And again on a new loop in this thread, after the others were closed.
    assert asyncio.run(asyncio.wait_for(writes(0), WAIT)) == [64] * 128


def test_a_loop_closed_while_awaiting_leaves_the_operation_to_finish(pair):
    received = np.zeros(8, np.uint8)
    inbox = pair.target.register(received)
    pending = pair.target_peer.recv(5, inbox)

    async def main():
        await asyncio.wait_for(_aw(pending), 0.05)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(main())  # closes its loop with the receive still watched
    source = pair.initiator.register(np.full(8, 3, np.uint8))
    assert pair.peer.send(5, source).wait(WAIT) == 8
    assert pending.wait(WAIT) == 8
    assert (received == 3).all()


def test_an_idle_loop_spins_for_a_quick_completion_and_still_settles_slow_ones():
    # wait_spin as by default (the other tests turn it off): an await on an idle loop spins
    # first; what does not complete within it goes through the loop's completions.
    target = ferry.Engine(**{**config(), "wait_spin": 0.05})
    initiator = ferry.Engine(**{**config(listen=False), "wait_spin": 0.05})
    try:
        peer = initiator.connect(target.address)
        target_peer = target.accept(WAIT)
        received = np.zeros(8, np.uint8)
        region = target.register(received, access=ferry.Access.REMOTE_WRITE)
        readable = target.register(np.zeros(8, np.uint8), access=ferry.Access.REMOTE_READ)
        source = initiator.register(np.full(8, 7, np.uint8))

        async def main():
            written = await peer.write(source, region.descriptor())
            with pytest.raises(ferry.PermissionDenied):
                await peer.write(source, readable.descriptor())
            inbox = target.register(np.zeros(8, np.uint8))
            pending = target_peer.recv(3, inbox)
            sender = asyncio.get_running_loop().call_later(0.2, peer.send, 3, source)
            got = await pending  # spins 50 ms, then waits for the send 150 ms later
            sender.cancel()
            return written, got

        assert asyncio.run(asyncio.wait_for(main(), WAIT)) == (8, 8)
        assert (received == 7).all()
    finally:
        initiator.shutdown()
        target.shutdown()


async def _aw(future):
    return await future


def test_notifications_async_iterator_and_unread(pair):
    region = pair.target.register(np.zeros(4096, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.ones(4096, np.uint8))

    async def main():
        got = []
        async with pair.target.notifications() as notes:
            for imm in range(5):
                pair.peer.write_with_imm(local, region.descriptor(), imm, length=16)
            async for event in notes:
                got.append(event.imm)
                if len(got) == 3:
                    break
            await pair.peer.write_with_imm(local, region.descriptor(), 10, length=16)
        return got, notes

    got, notes = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert len(got) == 3  # separate operations may complete in any order
    # Nothing was dropped: what the loop did not consume is in `unread` or back in next_imm().
    # (A delivery that raced with close() may still be landing: collect until all six are in.)
    rest = []
    deadline = time.monotonic() + WAIT
    while len(got) + len(notes.unread) + len(rest) < 6 and time.monotonic() < deadline:
        if (event := pair.target.next_imm(0.05)) is not None:
            rest.append(event.imm)
    assert sorted(got + [e.imm for e in notes.unread] + rest) == [0, 1, 2, 3, 4, 10]


def test_notifications_that_come_after_their_loop_closed_wait_in_unread(pair):
    region = pair.target.register(np.zeros(64, np.uint8), access=ferry.Access.REMOTE_WRITE)
    local = pair.initiator.register(np.ones(64, np.uint8))
    notes = pair.target.notifications()

    async def first():
        pair.peer.write_with_imm(local, region.descriptor(), 1, length=8)
        async for event in notes:
            return event.imm

    assert asyncio.run(asyncio.wait_for(first(), WAIT)) == 1  # its loop closes, notes open
    for imm in (2, 3, 4):
        pair.peer.write_with_imm(local, region.descriptor(), imm, length=8).wait(WAIT)
    deadline = time.monotonic() + WAIT
    while len(notes.unread) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e.imm for e in notes.unread] == [2, 3, 4]
    assert pair.target.next_imm(0.05) is None  # still the iterator's until it is closed
    asyncio.run(notes.close())
    pair.peer.write_with_imm(local, region.descriptor(), 5, length=8).wait(WAIT)
    event = pair.target.next_imm(WAIT)
    assert event is not None and event.imm == 5
    assert [e.imm for e in notes.unread] == [2, 3, 4]
