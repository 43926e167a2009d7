"""asyncio support: awaiting a Future and iterating over notifications without busy-polling.

A completion is handed to the event loop with ``loop.call_soon_threadsafe`` from the Ferry
thread that completes it; no Python code polls.
"""

from __future__ import annotations

import asyncio
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
    by then are kept in ``unread``: none is dropped.
    """

    def __init__(self, engine: _ferry.Engine) -> None:
        self._engine = engine
        self._queue: asyncio.Queue[_ferry.ImmEvent] | None = None
        self._closed = False
        self.unread: list[_ferry.ImmEvent] = []

    def _open(self) -> asyncio.Queue[_ferry.ImmEvent]:
        if self._queue is None:
            loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            self._closed = False

            def deliver(event: _ferry.ImmEvent) -> None:  # on a Ferry thread
                try:
                    loop.call_soon_threadsafe(self._arrive, event)
                except RuntimeError:  # the loop is closed: nobody iterates any more
                    self.unread.append(event)

            self._engine.on_imm(deliver)
        return self._queue

    def _arrive(self, event: _ferry.ImmEvent) -> None:  # on the loop
        if self._closed or self._queue is None:
            self.unread.append(event)  # a delivery that raced with close()
        else:
            self._queue.put_nowait(event)

    def __aiter__(self) -> "Notifications":
        return self

    async def __anext__(self) -> _ferry.ImmEvent:
        return await self._open().get()

    async def __aenter__(self) -> "Notifications":
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Switch notifications back to next_imm(); what was not consumed goes to ``unread``."""
        if self._queue is None:
            return
        self._closed = True
        self._engine.on_imm(None)
        while not self._queue.empty():
            self.unread.append(self._queue.get_nowait())
        self._queue = None
