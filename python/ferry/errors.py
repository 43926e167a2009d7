"""Ferry's exceptions: one class per error code of the C++ library.

Every exception Ferry raises derives from FerryError, which carries ``.code`` (the library's
stable code name, e.g. ``"out_of_bounds"``) and ``.message`` (what failed, naming the call).
Where a built-in exception means the same, the class derives from it too (Timeout is a
TimeoutError, InvalidArgument a ValueError, PeerLost a ConnectionError, ...).
"""

from __future__ import annotations


class FerryError(Exception):
    """Base of every Ferry error."""

    code: str
    message: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __str__(self) -> str:  # also where an OSError base would print errno fields
        return f"{self.code}: {self.message}"

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.code, self.message))


class InProgress(FerryError):
    """The operation has not completed yet."""


class InvalidArgument(FerryError, ValueError):
    """A malformed call: bad offset, read-only or non-contiguous memory, bad descriptor."""


class OutOfBounds(FerryError, IndexError):
    """Offset + length beyond a region."""


class PermissionDenied(FerryError, PermissionError):
    """The region does not grant the requested access."""


class UnknownRegion(FerryError):
    """No region with that id at the target."""


class Revoked(FerryError):
    """The region was deregistered."""


class WrongKey(FerryError):
    """The descriptor's key does not match the region."""


class StaleIncarnation(FerryError):
    """The descriptor belongs to an earlier incarnation of the peer."""


class WrongPeer(FerryError):
    """The descriptor belongs to another engine than this peer."""


class PeerLost(FerryError, ConnectionError):
    """The peer died or disconnected."""


class Timeout(FerryError, TimeoutError):
    """A wait or a connection attempt ran out of time."""


class Cancelled(FerryError):
    """The engine shut down or the peer was closed while the operation was in flight."""


class ProtocolError(FerryError):
    """A malformed or unexpected frame."""


class VersionMismatch(FerryError):
    """The peer (or a descriptor) speaks another protocol version."""


class AuthFailed(FerryError, PermissionError):
    """Shared-secret authentication failed."""


class Truncated(FerryError):
    """A message was larger than the receive buffer."""


class ResourceExhausted(FerryError):
    """A configured limit was reached."""


class ConnectFailed(FerryError, ConnectionError):
    """The peer could not be reached."""


class SystemFailure(FerryError, OSError):
    """A system call failed."""


class Unsupported(FerryError):
    """The transport or feature is not available here."""


class NotFound(FerryError, LookupError):
    """No entry under that name in the directory (etcd)."""


class AlreadyExists(FerryError):
    """The name is held by another engine."""


BY_CODE: dict[str, type[FerryError]] = {
    "in_progress": InProgress,
    "invalid_argument": InvalidArgument,
    "out_of_bounds": OutOfBounds,
    "permission_denied": PermissionDenied,
    "unknown_region": UnknownRegion,
    "revoked": Revoked,
    "wrong_key": WrongKey,
    "stale_incarnation": StaleIncarnation,
    "wrong_peer": WrongPeer,
    "peer_lost": PeerLost,
    "timeout": Timeout,
    "cancelled": Cancelled,
    "protocol": ProtocolError,
    "version_mismatch": VersionMismatch,
    "auth_failed": AuthFailed,
    "truncated": Truncated,
    "resource_exhausted": ResourceExhausted,
    "connect_failed": ConnectFailed,
    "system": SystemFailure,
    "unsupported": Unsupported,
    "not_found": NotFound,
    "already_exists": AlreadyExists,
}

__all__ = ["FerryError", "BY_CODE"] + [cls.__name__ for cls in BY_CODE.values()]
