"""Futures are awaitable and notifications arrive through `async for`; nothing polls."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import ferry
from conftest import WAIT


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
