"""One driver per engine, each used the way its own documentation and benchmarks use it.

Every driver has the same two sides:

    Target(transport, nbytes)        memory peers may read and write (.memory, a NumPy uint8
                                     array); .contact() is what an initiator needs
                                     (JSON-able); .close()
    Initiator(transport, contact, nbytes)
        .memory: the local buffer as a NumPy uint8 array
        .prepare(op, local_offsets, remote_offsets, length, alone) -> a repeatable operation
            (`alone`: it is never in flight beside another)
        .post(prepared) -> token,  .wait(token)  (raises on failure),  .close()
        ONE_BATCH_IN_FLIGHT (optional, on the initiator): operations in flight are posted as
            one batch of that many and waited whole

`transport` is "tcp" (each engine's TCP path over loopback) or "same-host" (each engine's best
path between two processes of one host). Offsets are NumPy int64 arrays; one entry is a single
operation, many entries one batch. A driver imports its engine only when chosen, so each runs
in its own interpreter (compare_engines.py).
"""

from __future__ import annotations

import base64
import mmap
import os
import time
from typing import Any

import numpy as np

WAIT_TIMEOUT_S = 60


def host_buffer(nbytes: int) -> np.ndarray:
    """The memory every engine registers: anonymous, with transparent huge pages asked for
    (madvise), whatever NumPy does. NumPy 2 asks for them itself and Debian's 1.24 did not get
    them here, and a copy between processes (process_vm_readv/writev) walks huge pages much
    faster: 1 MiB moved in 47 us with them and 79 us without, on the same VM."""
    area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(area, dtype=np.uint8)


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


# --- Ferry: its Python package; NumPy memory registered, as the peers' is ("ferry"), or memory
# from engine.allocate() ("ferry-allocate": a memory file a same-host peer maps and copies with
# memcpy, what the README tells same-host users to do); prepared operations posted again and
# again (peer.prepare_write / prepare_read).
class FerryTarget:
    ALLOCATE = False

    def __init__(self, transport: str, nbytes: int) -> None:
        import ferry

        self.engine = ferry.Engine(transports=[_ferry_transport(transport)])
        access = ferry.Access.REMOTE_READ_WRITE
        if self.ALLOCATE:
            self.region = self.engine.allocate(nbytes, access=access)
            self.memory = self.region.obj
        else:
            self.memory = host_buffer(nbytes)
            self.region = self.engine.register(self.memory, access=access)

    def contact(self) -> dict[str, Any]:
        return {"address": self.engine.address, "descriptor": _b64(self.region.descriptor())}

    def close(self) -> None:
        self.engine.shutdown()


class FerryInitiator:
    ALLOCATE = False

    def __init__(self, transport: str, contact: dict[str, Any], nbytes: int) -> None:
        import ferry

        self.engine = ferry.Engine(listen=False, transports=[_ferry_transport(transport)])
        self.peer = self.engine.connect(contact["address"])
        if self.ALLOCATE:
            self.local = self.engine.allocate(nbytes)
            self.memory = self.local.obj
        else:
            self.memory = host_buffer(nbytes)
            self.local = self.engine.register(self.memory)
        self.remote = ferry.Descriptor(_unb64(contact["descriptor"]))

    def prepare(self, op: str, local: np.ndarray, remote: np.ndarray, length: int,
                alone: bool) -> Any:
        del alone
        prepare = self.peer.prepare_write if op == "write" else self.peer.prepare_read
        if len(local) == 1:
            return prepare(self.local, self.remote, local_offset=int(local[0]),
                           remote_offset=int(remote[0]), length=length)
        return prepare(self.local, self.remote, local_offset=local, remote_offset=remote,
                       length=length)

    def post(self, prepared: Any) -> Any:
        return prepared.post()

    def wait(self, token: Any) -> None:
        token.wait(WAIT_TIMEOUT_S)

    def close(self) -> None:
        self.engine.shutdown()


class FerryAllocateTarget(FerryTarget):
    ALLOCATE = True


class FerryAllocateInitiator(FerryInitiator):
    ALLOCATE = True


def _ferry_transport(transport: str) -> str:
    return "shm" if transport == "same-host" else "tcp"


# --- NIXL: nixl_agent with its UCX backend (the default), DRAM registered from NumPy; the
# agents exchange metadata (get_agent_metadata / add_remote_agent); a transfer request made once
# (initialize_xfer) and posted again (transfer / check_xfer_state), as nixlbench reposts.
# Transports: UCX_TLS=tcp for "tcp"; UCX's defaults (shared memory) for "same-host".
def _nixl_environment(transport: str) -> None:
    if transport == "tcp":
        os.environ["UCX_TLS"] = "tcp"
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    os.environ.setdefault("UCX_LOG_LEVEL", "error")


# nixl-cu12 1.5.1 crashes (SIGSEGV) as its interpreter exits, whatever was released first: the
# harness leaves NIXL's processes with os._exit once the figures are out (EXIT_HARD).
class NixlTarget:
    EXIT_HARD = True

    def __init__(self, transport: str, nbytes: int) -> None:
        _nixl_environment(transport)
        from nixl_cu12 import nixl_agent, nixl_agent_config

        self.agent = nixl_agent("target", nixl_agent_config(backends=["UCX"]))
        self.buf = self.memory = host_buffer(nbytes)
        self.agent.register_memory([(self.buf.ctypes.data, nbytes, 0, "")], "DRAM")

    def contact(self) -> dict[str, Any]:
        return {"metadata": _b64(self.agent.get_agent_metadata()), "base": self.buf.ctypes.data}

    def close(self) -> None:
        pass


class NixlInitiator:
    EXIT_HARD = True

    def __init__(self, transport: str, contact: dict[str, Any], nbytes: int) -> None:
        _nixl_environment(transport)
        from nixl_cu12 import nixl_agent, nixl_agent_config

        self.agent = nixl_agent("initiator", nixl_agent_config(backends=["UCX"]))
        self.buf = self.memory = host_buffer(nbytes)
        self.agent.register_memory([(self.buf.ctypes.data, nbytes, 0, "")], "DRAM")
        self.remote_name = self.agent.add_remote_agent(_unb64(contact["metadata"]))
        self.remote_base = int(contact["base"])

    def _descs(self, base: int, offsets: np.ndarray, length: int) -> Any:
        rows = np.column_stack([offsets + base, np.full(len(offsets), length),
                                np.zeros(len(offsets))]).astype(np.int64)
        return self.agent.get_xfer_descs(rows, "DRAM")

    def prepare(self, op: str, local: np.ndarray, remote: np.ndarray, length: int,
                alone: bool) -> Any:
        del alone
        return self.agent.initialize_xfer(op.upper(), self._descs(self.buf.ctypes.data, local, length),
                                          self._descs(self.remote_base, remote, length),
                                          self.remote_name)

    def post(self, prepared: Any) -> Any:
        if self.agent.transfer(prepared) == "ERR":
            raise RuntimeError("nixl transfer: ERR")
        return prepared

    def wait(self, token: Any) -> None:
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while (state := self.agent.check_xfer_state(token)) == "PROC":
            if time.monotonic() > deadline:
                raise RuntimeError(f"nixl check_xfer_state: still PROC after {WAIT_TIMEOUT_S} s")
        if state != "DONE":
            raise RuntimeError(f"nixl check_xfer_state: {state}")

    def close(self) -> None:
        pass


# --- Mooncake Transfer Engine: its Python TransferEngine with the P2P handshake (no metadata
# service) and its TCP transport, the one its wheel offers for CPU memory without RDMA (also
# between two processes of one host); NumPy memory registered (register_memory); one operation
# at a time with transfer_sync_*, batches with batch_transfer_async_* and
# get_batch_transfer_status. Operations in flight are one batch of that many, posted and waited
# whole, as its transfer_engine_bench does: separate batches in flight crashed it (a double
# free) or never completed (transfer_submit_write, transfer_check_status), 0.3.13.post1.
class MooncakeTarget:
    def __init__(self, transport: str, nbytes: int) -> None:
        del transport
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        _mooncake_check("initialize", self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
        self.buf = self.memory = host_buffer(nbytes)
        _mooncake_check("register_memory", self.engine.register_memory(self.buf.ctypes.data, nbytes))

    def contact(self) -> dict[str, Any]:
        return {"target": f"127.0.0.1:{self.engine.get_rpc_port()}", "base": self.buf.ctypes.data}

    def close(self) -> None:
        pass


class MooncakeInitiator:
    ONE_BATCH_IN_FLIGHT = True

    def __init__(self, transport: str, contact: dict[str, Any], nbytes: int) -> None:
        del transport
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        _mooncake_check("initialize", self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
        self.buf = self.memory = host_buffer(nbytes)
        _mooncake_check("register_memory", self.engine.register_memory(self.buf.ctypes.data, nbytes))
        self.target = contact["target"]
        self.remote_base = int(contact["base"])

    def prepare(self, op: str, local: np.ndarray, remote: np.ndarray, length: int,
                alone: bool) -> Any:
        base = self.buf.ctypes.data
        return (op, alone, [int(x) + base for x in local], [int(x) + self.remote_base for x in remote],
                [length] * len(local))

    def post(self, prepared: Any) -> Any:
        op, alone, local, remote, lengths = prepared
        if alone and len(local) == 1:  # one operation at a time: the synchronous call
            sync = self.engine.transfer_sync_write if op == "write" else self.engine.transfer_sync_read
            _mooncake_check(f"transfer_sync_{op}", sync(self.target, local[0], remote[0], lengths[0]))
            return None
        post = (self.engine.batch_transfer_async_write if op == "write"
                else self.engine.batch_transfer_async_read)
        batch = post(self.target, local, remote, lengths)
        if batch == 0:
            raise RuntimeError(f"mooncake batch_transfer_async_{op} failed")
        return batch

    def wait(self, token: Any) -> None:
        if token is not None:
            _mooncake_check("get_batch_transfer_status",
                            self.engine.get_batch_transfer_status([token]))

    def close(self) -> None:
        pass


def _mooncake_check(call: str, rc: int) -> None:
    if rc != 0:
        raise RuntimeError(f"mooncake {call}: {rc}")


DRIVERS = {
    "ferry": (FerryTarget, FerryInitiator),
    "ferry-allocate": (FerryAllocateTarget, FerryAllocateInitiator),
    "nixl": (NixlTarget, NixlInitiator),
    "mooncake": (MooncakeTarget, MooncakeInitiator),
}
