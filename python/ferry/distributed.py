"""torch.distributed backend "ferry": send, recv and their batches over Ferry's tagged messages
(shared memory between ranks of one host, TCP or RDMA between hosts), and barrier, broadcast,
all_gather and all_reduce built on them (correct, not tuned).

    import ferry.distributed                  # registers the backend
    dist.init_process_group("ferry")          # under torchrun: rank, size and store from the env

Ranks find each other through torch's own store (torchrun's TCPStore, or the one given to
init_process_group): each publishes its engine's addresses and id there, and rank 0 a fresh
shared secret that every rank's engine then requires of its peers. Each pair of ranks has one
Ferry connection, used both ways: the lower rank connects, the higher accepts.

Environment: FERRY_DIST_LISTEN_HOST (default 0.0.0.0: every interface, since ranks may be on
other hosts; the secret keeps others out), and every FERRY_* variable an Engine reads
(FERRY_TRANSPORTS, FERRY_TCP_STREAMS, ...). CPU tensors only, for now; contiguous ones are sent
in place (registered, not copied).
"""

from __future__ import annotations

import datetime
import json
import operator
import os
from functools import reduce
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

import ferry
from ferry._dial import connect_to
from ferry.errors import ConnectFailed, InvalidArgument, Timeout, Unsupported

BACKEND = "ferry"
# User tags live below this; collectives use tags with the top bit set and their call's
# sequence number, so that no collective's message can match a user's receive.
_MAX_USER_TAG = 1 << 62
_COLLECTIVE = 1 << 63
# Tags one collective call may use: its steps (a tensor's index, twice for all_reduce).
_STEPS = 1 << 24

_REDUCERS: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    dist.ReduceOp.SUM: operator.add,
    dist.ReduceOp.PRODUCT: operator.mul,
    dist.ReduceOp.MIN: torch.minimum,
    dist.ReduceOp.MAX: torch.maximum,
    dist.ReduceOp.BAND: torch.bitwise_and,
    dist.ReduceOp.BOR: torch.bitwise_or,
    dist.ReduceOp.BXOR: torch.bitwise_xor,
}


def _seconds(timeout: Optional[datetime.timedelta], default: float) -> float:
    # torch passes timedelta(0) for "the group's timeout".
    if timeout is None or timeout.total_seconds() <= 0:
        return default
    return timeout.total_seconds()


def _checked(tensor: torch.Tensor, what: str) -> torch.Tensor:
    if tensor.device.type != "cpu":
        raise Unsupported("unsupported", f"{what}: only CPU tensors so far ({tensor.device})")
    if not tensor.is_contiguous():
        raise InvalidArgument("invalid_argument",
                                    f"{what}: the tensor is not contiguous (tensor.contiguous())")
    return tensor


class _Work(Work):
    """The Ferry futures of one call and the registrations they use, released once done. Each
    future comes with the bytes it must move (a receive's message must fill its tensor, as
    gloo requires), or None."""

    def __init__(self, futures: list, holds: list, timeout: float) -> None:
        super().__init__()
        self._futures = futures
        self._holds = holds
        self._timeout = timeout
        self._error: Optional[BaseException] = None
        self._done = False

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        if not self._done:
            limit = _seconds(timeout, self._timeout)
            try:
                for f, expected in self._futures:
                    moved = f.wait(limit)
                    if expected is not None and moved != expected:
                        raise InvalidArgument("invalid_argument",
                                              f"recv: the message had {moved} bytes, the tensor "
                                              f"{expected}")
            except Timeout:
                raise  # still running: a later wait may finish it
            except BaseException as e:  # noqa: BLE001 (kept for is_success and re-raised)
                self._error = e
            self._done = True
            self._futures, self._holds = [], []
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done or all(f.done() for f, _ in self._futures)

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None


class FerryProcessGroup(dist.ProcessGroup):
    """One Ferry engine per group, connected to every other rank of it."""

    def __init__(self, store: dist.Store, rank: int, size: int,
                 timeout: datetime.timedelta) -> None:
        # torch's stubs miss this constructor, and type its collectives as overloads that a
        # subclass cannot match (the ignores below).
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._timeout = timeout.total_seconds()
        # Keys of this initialization only: every rank adds one to a counter, so each group made
        # on the same store (init, destroy, init again) counts as a new generation.
        prefix = f"ferry/{(store.add('ferry/joined', 1) - 1) // size}/"
        if rank == 0:
            store.set(prefix + "secret", os.urandom(32).hex())
        secret = store.get(prefix + "secret").decode()
        self._engine = ferry.Engine(
            listen_host=os.environ.get("FERRY_DIST_LISTEN_HOST", "0.0.0.0"), secret=secret,
            connect_timeout=self._timeout)
        store.set(f"{prefix}rank/{rank}",
                  json.dumps({"id": self._engine.id, "addresses": self._engine.addresses}))
        ranks = [json.loads(store.get(f"{prefix}rank/{r}")) for r in range(size)]
        self._peers: list[Optional[ferry.Peer]] = [None] * size
        for r in range(rank + 1, size):
            self._peers[r] = connect_to(self._engine, ranks[r]["addresses"], ranks[r]["id"])
        by_id = {ranks[r]["id"]: r for r in range(rank)}
        for _ in range(rank):
            peer = self._engine.accept(self._timeout)
            if peer is None or peer.engine_id not in by_id:
                raise ConnectFailed(
                    "connect_failed", f"rank {rank}: the lower ranks did not all connect within "
                    f"{self._timeout} s")
            self._peers[by_id.pop(peer.engine_id)] = peer
        # An empty tensor moves as an empty message into this.
        self._empty = self._engine.register(bytearray(1))
        self._sequence = 0
        # Sends and receives in flight, so that a Work dropped before its end (an isend left
        # to finish) keeps its tensors registered until then: dropping a region in use would
        # revoke it under the operation.
        self._in_flight: list[_Work] = []
        self._prune_at = 64  # the list's length that makes the next call drop finished ones

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    # ---- point to point ----

    def _peer(self, rank: int) -> ferry.Peer:
        peer = self._peers[rank] if 0 <= rank < self.size() else None
        if peer is None:
            raise InvalidArgument("invalid_argument",
                                        f"rank {rank}: not another rank of this group")
        return peer

    def _post_all(self, posts: list) -> _Work:
        """Posts every (send?, tensor, rank, tag), all checked before any is posted, and gives
        the Work of them all."""
        for send, t, rank, _ in posts:
            self._peer(rank)
            _checked(t, "send" if send else "recv")
        futures: list = []
        holds: list = []
        for send, tensor, rank, tag in posts:
            peer = self._peer(rank)
            if tensor.numel() == 0:
                region, length = self._empty, 0
            else:
                region = self._engine.register(tensor)
                length = tensor.numel() * tensor.element_size()
                holds.append(region)
            if send:
                futures.append((peer.send(tag, region, 0, length), None))
            else:
                futures.append((peer.recv(tag, region, 0, length), length))
        return _Work(futures, holds, self._timeout)

    def _p2p(self, send: bool, tensors: Sequence[torch.Tensor], rank: int, tag: int) -> Work:
        if not 0 <= tag < _MAX_USER_TAG:
            raise InvalidArgument("invalid_argument", f"tag {tag}: must be 0..2**62-1")
        work = self._post_all([(send, t, rank, tag) for t in tensors])
        self._in_flight.append(work)
        if len(self._in_flight) >= self._prune_at:  # amortized: a batch of 64 costs one pass
            self._in_flight = [w for w in self._in_flight if not w.is_completed()]
            self._prune_at = max(64, 2 * len(self._in_flight))
        return work

    # Each send and receive is posted as it comes and waits for no other, so the operations of
    # batch_isend_irecv are all in flight at once over the pair's one connection (a peer's
    # messages are matched in order, per tag).
    def send(self, tensors: list, dst: int, tag: int) -> Work:
        return self._p2p(True, tensors, dst, tag)

    def recv(self, tensors: list, src: int, tag: int) -> Work:
        return self._p2p(False, tensors, src, tag)

    # ---- collectives, built on point to point ----

    def _collective(self) -> int:
        """The tag base of the next collective call, the same on every rank."""
        self._sequence += 1
        return _COLLECTIVE | ((self._sequence % (1 << 38)) * _STEPS)

    def _exchange(self, sends: list, recvs: list) -> None:
        """Posts every (tensor, rank, tag) of both lists, then waits for all of them."""
        self._post_all([(False, t, r, tag) for t, r, tag in recvs] +
                       [(True, t, r, tag) for t, r, tag in sends]).wait()

    def _done(self) -> Work:
        return _Work([], [], self._timeout)

    def barrier(self, opts: Any = None) -> Work:
        base, me, others = self._collective(), self.rank(), range(1, self.size())
        token = torch.empty(0, dtype=torch.uint8)
        if me == 0:
            self._exchange([], [(token, r, base) for r in others])
            self._exchange([(token, r, base + 1) for r in others], [])
        else:
            self._exchange([(token, 0, base)], [])
            self._exchange([], [(token, 0, base + 1)])
        return self._done()

    def broadcast(self, tensors: list, opts: Any) -> Work:  # type: ignore[override]
        base, root = self._collective(), opts.rootRank
        others = [r for r in range(self.size()) if r != root]
        if self.rank() == root:
            self._exchange([(t, r, base + i) for i, t in enumerate(tensors) for r in others], [])
        else:
            self._exchange([], [(t, root, base + i) for i, t in enumerate(tensors)])
        return self._done()

    def allgather(  # type: ignore[override]
            self, outputs: list, inputs: list, opts: Any = None) -> Work:
        base, me = self._collective(), self.rank()
        others = [r for r in range(self.size()) if r != me]
        sends, recvs = [], []
        for i, (out, t) in enumerate(zip(outputs, inputs)):
            out[me].copy_(t)
            sends += [(t, r, base + i) for r in others]
            recvs += [(out[r], r, base + i) for r in others]
        self._exchange(sends, recvs)
        return self._done()

    def allreduce(self, tensors: list, opts: Any = None) -> Work:  # type: ignore[override]
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        reducer = next((fn for known, fn in _REDUCERS.items() if op == known), None)
        if reducer is None:
            raise Unsupported("unsupported", f"all_reduce: reduce op {op} is not supported")
        base, me, size = self._collective(), self.rank(), self.size()
        n = len(tensors)
        if me == 0:
            # Rank 0 reduces in rank order (0, 1, 2, ...), then hands the result out.
            parts = [[torch.empty_like(t) for t in tensors] for _ in range(1, size)]
            self._exchange([], [(parts[r - 1][i], r, base + i) for r in range(1, size)
                                for i in range(n)])
            for i, t in enumerate(tensors):
                t.copy_(reduce(reducer, [p[i] for p in parts], t))
            self._exchange([(t, r, base + n + i) for r in range(1, size)
                            for i, t in enumerate(tensors)], [])
        else:
            self._exchange([(t, 0, base + i) for i, t in enumerate(tensors)], [])
            self._exchange([], [(t, 0, base + n + i) for i, t in enumerate(tensors)])
        return self._done()


def _create(store: dist.Store, rank: int, size: int,
            timeout: datetime.timedelta) -> FerryProcessGroup:
    return FerryProcessGroup(store, rank, size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:  # type: ignore[attr-defined]
    dist.Backend.register_backend(BACKEND, _create)
