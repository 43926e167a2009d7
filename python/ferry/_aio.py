"""asyncio support: awaiting a Future and iterating over notifications without busy-polling.

A completion is handed to the event loop with ``loop.call_soon_threadsafe`` from the Ferry
thread that completes it; no Python code polls.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Generator, cast

from . import _ferry


def _settle(result: asyncio.Future[Any], future: _ferry.Future) -> None:
    if result.done():  # the awaiting task was cancelled
        return
    error = future.exception()
    if error is None:
        result.set_result(future.bytes)
    else:
        result.set_exception(cast(BaseException, error))


def await_future(future: _ferry.Future) -> Generator[Any, None, int]:
    loop = asyncio.get_running_loop()
    result: asyncio.Future[int] = loop.create_future()

    def on_done(done: _ferry.Future) -> None:
        try:
            loop.call_soon_threadsafe(_settle, result, done)
        except RuntimeError:  # the loop was closed meanwhile: nobody awaits any more
            pass

    future.add_done_callback(on_done)
    return (yield from result.__await__())


class Notifications:
    """The engine's write_with_imm notifications as an async iterator (``async for``).

    While it is open, notifications go to it instead of ``Engine.next_imm()``; ``close()`` (or
    leaving ``async with``) switches them back. Notifications that arrived but were not consumed
    stay in ``unread`` (a delivery racing with close() lands there too): none is dropped.
    """

    def __init__(self, engine: _ferry.Engine) -> None:
        self._engine = engine
        # Filled by a Ferry thread, drained by the loop: a delivery never depends on the loop
        # still running, so closing it loses nothing.
        self._inbox: collections.deque[_ferry.ImmEvent] = collections.deque()
        self._wake: asyncio.Event | None = None

    @property
    def unread(self) -> list[_ferry.ImmEvent]:
        return list(self._inbox)

    def _open(self) -> asyncio.Event:
        if self._wake is None:
            loop = asyncio.get_running_loop()
            wake = asyncio.Event()
            inbox = self._inbox

            def deliver(event: _ferry.ImmEvent) -> None:  # on a Ferry thread
                inbox.append(event)
                try:
                    loop.call_soon_threadsafe(wake.set)
                except RuntimeError:  # the loop is closed: the event waits in `unread`
                    pass

            self._wake = wake
            self._engine.on_imm(deliver)
        return self._wake

    def __aiter__(self) -> "Notifications":
        return self

    async def __anext__(self) -> _ferry.ImmEvent:
        wake = self._open()
        while not self._inbox:
            wake.clear()
            if self._inbox:
                break
            await wake.wait()
        return self._inbox.popleft()

    async def __aenter__(self) -> "Notifications":
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Switch notifications back to next_imm(); what was not consumed stays in ``unread``."""
        if self._wake is not None:
            self._engine.on_imm(None)
            self._wake = None
