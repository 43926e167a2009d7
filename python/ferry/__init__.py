"""Ferry: peer-to-peer transfers between registered memory of two processes.

    import ferry, numpy as np
    target = ferry.Engine()
    buf = np.zeros(1 << 20, dtype=np.uint8)
    region = target.register(buf, access=ferry.Access.REMOTE_WRITE)
    blob = region.descriptor()                     # bytes: hand it to the initiator

    initiator = ferry.Engine(listen=False)         # or ferry.Engine(config), a ferry.Config
    peer = initiator.connect(target.address)
    src = initiator.register(np.full(4096, 7, dtype=np.uint8))
    remote = ferry.Descriptor(blob)                # decoded once (bytes also work, slower)
    peer.write(src, remote).wait(5.0)              # or: await peer.write(src, remote)

Page-table batches: pass integer arrays as offsets (and lengths, or one block size):
    peer.write(src, remote, local_offset=idx * 4096, remote_offset=slots * 4096, length=4096)
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

from . import _ferry
from . import _log
from ._aio import Notifications
from .errors import *  # noqa: F401,F403  (the exception classes are part of the package)
from .errors import BY_CODE, FerryError

_ferry._set_error_classes(dict(BY_CODE))  # type: ignore[attr-defined]
_log.start()

Access = _ferry.Access
Config = _ferry.Config
Descriptor = _ferry.Descriptor
Region = _ferry.Region
Peer = _ferry.Peer
Prepared = _ferry.Prepared
Future = _ferry.Future
ImmEvent = _ferry.ImmEvent
NamedEngine = _ferry.NamedEngine
Watch = _ferry.Watch
__version__: str = _ferry.__version__  # type: ignore[attr-defined]
LATENCY_BUCKET_BOUNDS_S: list = _ferry.LATENCY_BUCKET_BOUNDS_S  # type: ignore[attr-defined]
set_log_level = _ferry.set_log_level  # type: ignore[attr-defined]
log_level = _ferry.log_level  # type: ignore[attr-defined]

_live_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()
# A forked child's engines are its parent's, inert there (every call raises InvalidArgument): the
# exit hook leaves them to the parent.
os.register_at_fork(after_in_child=_live_engines.clear)


class Engine(_ferry.Engine):
    __doc__ = _ferry.Engine.__doc__

    def __init__(self, config: Config | None = None, /, **keywords: Any) -> None:
        super().__init__(config, **keywords)
        _live_engines.add(self)

    def notifications(self) -> Notifications:
        """An async iterator of write_with_imm notifications (see ferry.Notifications)."""
        return Notifications(self)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def transports() -> list[dict[str, Any]]:
    """Transports compiled in and whether they are usable here, and why not."""
    return _ferry.Engine.transports()


def settings() -> list[dict[str, Any]]:
    """Every transport setting (name, type, value, default, range, environment, help): what
    Engine(settings={...}) and the FERRY_<TRANSPORT>_<NAME> variables take."""
    return _ferry.Engine.settings()


@atexit.register
def _shutdown_engines() -> None:
    # Before the interpreter winds down: no Ferry thread calls into Python after this.
    for engine in list(_live_engines):
        engine.shutdown()


__all__ = [
    "Access", "Config", "Descriptor", "Engine", "Future", "ImmEvent", "NamedEngine", "Notifications",
    "Peer", "Prepared", "Region", "Watch",
    "FerryError", "log_level", "set_log_level", "settings", "transports", "__version__",
] + [cls.__name__ for cls in BY_CODE.values()]
