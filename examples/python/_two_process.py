"""What the examples share: both sides as two processes on this host.

The target runs in a child process and hands its "offer" (address, descriptors) to the
initiator through a pipe; any channel works (a file, a key-value store, torch.distributed's
object exchange, or Ferry itself).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from typing import Any, Callable

Offer = Any


def _target_main(target: Callable[[Callable[[Offer], None]], None], conn: Any) -> None:
    target(conn.send)


def serve_until_closed(peer: Any) -> None:
    """A target's wait for its initiator to leave (it shuts its engine down)."""
    while peer.connected:
        time.sleep(0.01)


def serve_one(engine: Any) -> None:
    """A target that never talks to its peer itself: serve until one initiator came and went.

    It watches the engine's counts rather than accept(): an initiator that is quickly done may
    leave before accept() would have returned it, and a peer that left is not returned.
    """
    deadline = time.monotonic() + 60
    while engine.stats["peers_admitted"] == 0:
        if time.monotonic() > deadline:
            raise SystemExit("no initiator connected within 60 s")
        time.sleep(0.01)
    while engine.stats["peers"] > 0:
        time.sleep(0.01)


def run(target: Callable[[Callable[[Offer], None]], None],
        initiator: Callable[[Offer], None]) -> None:
    """Run `target(publish)` in a child process and `initiator(offer)` here."""
    ctx = mp.get_context("spawn")  # a fresh interpreter: no engine threads inherited
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_target_main, args=(target, theirs))
    child.start()
    try:
        if not ours.poll(60):
            raise SystemExit("the target published no offer within 60 s")
        initiator(ours.recv())
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    if child.exitcode != 0:
        sys.exit(f"the target failed (exit code {child.exitcode})")
