"""Ferry's log records in Python's logging module, under the "ferry" logger.

Records come from Ferry's threads through a bounded queue in the extension; one daemon thread
takes them in batches (waiting with the GIL released) and hands them to
``logging.getLogger("ferry.<component>")``. So no Ferry thread waits for the GIL to log, and a
Python program configures Ferry's output as it configures any other library's. The level Ferry
logs at is set by ``FERRY_LOG`` or ``ferry.set_log_level``; where ``FERRY_LOG_FILE`` is set,
records go to that file instead.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from . import _ferry

# Ferry's levels (ferry::LogLevel) as logging's; trace is below DEBUG.
TRACE = 5
_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: TRACE}

_thread: threading.Thread | None = None
_stopping = threading.Event()


def _pump() -> None:
    while True:
        records = _ferry._take_logs(0.5)  # type: ignore[attr-defined]
        for level, component, message in records:
            logging.getLogger("ferry." + component).log(_LEVELS.get(level, logging.INFO), message)
        if _stopping.is_set() and not records:
            return


def start() -> None:
    """Forwards Ferry's records to logging (unless FERRY_LOG_FILE names a file for them)."""
    global _thread
    if _thread is not None or os.environ.get("FERRY_LOG_FILE"):
        return
    _ferry._forward_logs()  # type: ignore[attr-defined]
    _thread = threading.Thread(target=_pump, name="ferry-log", daemon=True)
    _thread.start()


@atexit.register
def _stop() -> None:
    # Registered before the package's own exit hook, so it runs after the engines shut down
    # (atexit runs in reverse) and their last records are delivered first.
    _stopping.set()
    _ferry._stop_forwarding_logs()  # type: ignore[attr-defined]
    if _thread is not None:
        _thread.join(timeout=5)
