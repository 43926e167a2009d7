"""asyncio support: awaiting a Future and iterating over notifications without busy-polling.

Awaited futures are watched by one ``_ferry.Completions`` per event loop, and notifications
queue in a ``_ferry.Notifier``: a Ferry thread notes a completion or a notification there without
taking the GIL, and the loop, woken once through an eventfd for however many came meanwhile,
takes them all. No Python code polls; a loop that has nothing else to run spins up to the
engine's ``wait_spin`` (50 us by default, 0: never) before it sleeps, as ``Future.wait()`` does.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import weakref
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


class _LoopCompletions:
    """One event loop's awaited futures, settled in batches when the loop reads the eventfd.

    It holds no reference to its loop (the loop holds it, through its reader), so a loop that
    is dropped takes it along.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._queue = _ferry.Completions()
        self._waiting: dict[int, tuple[asyncio.Future[int], _ferry.Future]] = {}
        self._tokens = itertools.count()
        loop.add_reader(self._queue.fileno(), self._drain)

    def watch(self, loop: asyncio.AbstractEventLoop, future: _ferry.Future) -> asyncio.Future[int]:
        result: asyncio.Future[int] = loop.create_future()
        token = next(self._tokens)
        self._waiting[token] = (result, future)
        self._queue.watch(future, token)
        return result

    def _drain(self) -> None:
        waiting = self._waiting
        for token in self._queue.drain():
            _settle(*waiting.pop(token))


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopCompletions] = (
    weakref.WeakKeyDictionary())


def _finished(value: int) -> Generator[Any, None, int]:
    """An awaitable's iterator that is done at once, with `value`."""
    return value
    yield  # a generator, never reached  # pylint: disable=unreachable


def await_future(future: _ferry.Future) -> Generator[Any, None, int]:
    """What ``Future.__await__`` returns: the iterator of an asyncio future that the loop's
    completions settle, or one done at once for a future already complete."""
    loop = asyncio.get_running_loop()
    # A loop with nothing else to run spins up to wait_spin first, as wait() would: a completion
    # that comes within microseconds then costs no wake-up of the progress thread or the loop.
    # (`_ready` is CPython's run queue; other loops skip the spin.)
    if future.done() or (not getattr(loop, "_ready", True) and cast(Any, future)._spin()):
        error = future.exception()
        if error is not None:
            raise cast(BaseException, error)
        return _finished(future.bytes)
    completions = _per_loop.get(loop)
    if completions is None:
        completions = _per_loop[loop] = _LoopCompletions(loop)
    return completions.watch(loop, future).__await__()


class Notifications:
    """The engine's write_with_imm notifications as an async iterator (``async for``).

    While it is open, notifications go to it instead of ``Engine.next_imm()``; ``close()`` (or
    leaving ``async with``) switches them back. Notifications that arrived but were not consumed
    stay in ``unread`` (a delivery racing with close() lands there too): none is dropped.
    """

    def __init__(self, engine: _ferry.Engine) -> None:
        self._engine = engine
        self._inbox: collections.deque[_ferry.ImmEvent] = collections.deque()
        # Queued by Ferry threads without the GIL, taken by the loop when its eventfd is
        # readable: a delivery never depends on the loop still running, so closing it loses
        # nothing (`unread` takes what is queued).
        self._notifier: _ferry.Notifier | None = None
        self._closed: _ferry.Notifier | None = None  # the last one closed: a late delivery
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def unread(self) -> list[_ferry.ImmEvent]:
        for notifier in (self._closed, self._notifier):
            if notifier is not None:
                self._inbox.extend(notifier.drain())
        return list(self._inbox)

    def _open(self) -> asyncio.Event:
        if self._notifier is None or self._wake is None:
            self._loop = asyncio.get_running_loop()
            self._notifier = _ferry.Notifier(self._engine)
            self._wake = asyncio.Event()
            self._loop.add_reader(self._notifier.fileno(), self._take)
        return self._wake

    def _take(self) -> None:  # on the loop, its eventfd readable
        if self._notifier is not None and self._wake is not None:
            self._inbox.extend(self._notifier.drain())
            self._wake.set()

    def __aiter__(self) -> "Notifications":
        return self

    async def __anext__(self) -> _ferry.ImmEvent:
        wake = self._open()
        while not self._inbox:
            wake.clear()
            await wake.wait()
        return self._inbox.popleft()

    async def __aenter__(self) -> "Notifications":
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Switch notifications back to next_imm(); what was not consumed stays in ``unread``."""
        notifier, self._notifier, self._wake = self._notifier, None, None
        if notifier is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(notifier.fileno())
            notifier.close()
            self._inbox.extend(notifier.drain())
            self._closed = notifier
