"""Coroutine mode: operations are awaited, notifications arrive through `async for`, and the
event loop is never blocked (completions are handed to it, nothing polls)."""

import asyncio

import numpy as np

import ferry
from _two_process import run, serve_one

STEPS, BLOCK = 16, 4096


def target(publish):
    async def main():
        with ferry.Engine() as engine:
            data = np.zeros(STEPS * BLOCK, dtype=np.uint8)
            region = engine.register(data, access=ferry.Access.REMOTE_WRITE)
            publish((engine.address, region.descriptor()))
            seen = set()
            async with engine.notifications() as notes:
                async for event in notes:
                    assert (data[event.imm * BLOCK:(event.imm + 1) * BLOCK] == event.imm).all()
                    seen.add(event.imm)
                    if len(seen) == STEPS:
                        break
            print(f"target: {STEPS} notifications received in a coroutine")
            await asyncio.to_thread(serve_one, engine)  # until the initiator has left

    asyncio.run(main())


def initiator(offer):
    address, descriptor = offer

    async def main():
        with ferry.Engine(listen=False) as engine:
            peer = await asyncio.to_thread(engine.connect, address)
            source = np.repeat(np.arange(STEPS, dtype=np.uint8), BLOCK)
            region = engine.register(source)
            # Every write in flight at once; gather awaits them all.
            await asyncio.gather(*(
                peer.write_with_imm(region, descriptor, step, local_offset=step * BLOCK,
                                    remote_offset=step * BLOCK, length=BLOCK)
                for step in range(STEPS)))
            print(f"initiator: {STEPS} writes awaited together")

    asyncio.run(main())


if __name__ == "__main__":
    run(target, initiator)
