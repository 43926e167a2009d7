"""Ferry as a tensor transport for Ray's direct-transport (RDT) objects, through the plug-in
interface Ray offers (ray.experimental.register_tensor_transport, Ray 2.5x and later), as NIXL
plugs in:

    import ferry.ray_transport
    ferry.ray_transport.register()        # in the driver, before the actor classes

    @ray.remote
    class Prefill:
        @ray.method(tensor_transport="FERRY")
        def kv(self) -> torch.Tensor: ...

One-sided: the producing actor registers the tensors it returned with its engine (remote read)
and puts its address and their descriptors in the object's metadata; an actor that receives the
object connects to the producer once and reads every tensor in one batch straight into tensors
of its own; Ray's reference counting ends the registrations (garbage_collect). The producer's
Python takes no part in the transfer.

Each process has one engine, listening on the node's address (FERRY_RAY_LISTEN_HOST overrides
it), with FERRY_TRANSPORTS and the other FERRY_* variables as any engine reads them. As with
NIXL's, a descriptor is the capability to read its tensor: keep Ray's network to the cluster.
CPU tensors for now.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, List, Optional

import ray
import torch
from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata,
    TensorTransportManager,
    TensorTransportMetadata,
)

import ferry
from ferry._dial import connect_to
from ferry.errors import Unsupported

NAME = "FERRY"
# Each read waits at most this long (seconds): a producer that died fails the transfer instead of
# holding the consumer.
_READ_TIMEOUT = float(os.environ.get("FERRY_RAY_TIMEOUT", "60"))


@dataclass
class FerryTransportMetadata(TensorTransportMetadata):
    """Where the producer's engine listens, its id, and one descriptor per tensor (None for an
    empty tensor, which moves no bytes)."""

    address: str = ""
    engine_id: int = 0
    descriptors: List[Optional[bytes]] = field(default_factory=list)


class _Process:
    """This process's engine, its registrations by object, and its connections by producer."""

    def __init__(self) -> None:
        host = os.environ.get("FERRY_RAY_LISTEN_HOST") or ray.util.get_node_ip_address()
        self.engine = ferry.Engine(listen_host=host)
        self.lock = threading.Lock()
        self.published: dict[str, list] = {}  # object id -> its tensors' regions
        self.peers: dict[str, ferry.Peer] = {}  # producer address -> connection

    def peer(self, address: str, engine_id: int) -> ferry.Peer:
        with self.lock:
            peer = self.peers.get(address)
            if peer is None or not peer.connected or peer.engine_id != engine_id:
                if peer is not None:
                    peer.close()  # a producer gone, or another process at its address now
                peer = connect_to(self.engine, [address], engine_id)
                self.peers[address] = peer
            return peer


_process: Optional[_Process] = None
_process_lock = threading.Lock()


def _here() -> _Process:
    global _process
    with _process_lock:
        if _process is None:
            _process = _Process()
        return _process


def _cpu_contiguous(tensors: List[Any]) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise Unsupported("unsupported", f"the FERRY transport moves CPU tensors so far, "
                                             f"not {t.device}")
        if not t.is_contiguous():
            raise ValueError("the FERRY transport needs contiguous tensors (tensor.contiguous())")


class FerryTensorTransport(TensorTransportManager):
    def tensor_transport_backend(self) -> str:
        return NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        # A read in flight cannot be taken back; it ends within _READ_TIMEOUT at the latest.
        return False

    def actor_has_tensor_transport(self, actor: "ray.actor.ActorHandle") -> bool:
        def __ray_actor_has_ferry__(self: Any) -> bool:
            try:
                import ferry  # noqa: F401
            except ImportError:
                return False
            return True

        return bool(ray.get(actor.__ray_call__.options(concurrency_group="_ray_system").remote(
            __ray_actor_has_ferry__)))

    def extract_tensor_transport_metadata(
            self, obj_id: str, rdt_object: List[Any]) -> FerryTransportMetadata:
        _cpu_contiguous(rdt_object)
        here = _here()
        regions = [here.engine.register(t, access=ferry.Access.REMOTE_READ) if t.numel() else None
                   for t in rdt_object]
        with here.lock:
            here.published[obj_id] = regions
        return FerryTransportMetadata(
            tensor_meta=[(t.shape, t.dtype) for t in rdt_object],
            tensor_device="cpu" if rdt_object else None,
            address=here.engine.address,
            engine_id=here.engine.id,
            descriptors=[r.descriptor() if r is not None else None for r in regions])

    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any,
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        return CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: Any,
                              communicator_metadata: Any,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        meta = tensor_transport_metadata
        assert isinstance(meta, FerryTransportMetadata)
        if target_buffers:
            _cpu_contiguous(target_buffers)
            tensors = list(target_buffers)
        else:
            tensors = [torch.empty(shape, dtype=dtype) for shape, dtype in meta.tensor_meta]
        wanted = [(t, d) for t, d in zip(tensors, meta.descriptors) if d is not None]
        if wanted:
            here = _here()
            peer = here.peer(meta.address, meta.engine_id)
            # Every read posted before any is waited for: one batch in flight. The registrations
            # end before an error is raised (deregistering waits for a read still under way, or
            # cuts it off), so nothing writes into these tensors after.
            locals_ = [here.engine.register(t) for t, _ in wanted]
            try:
                reads = [peer.read(local, ferry.Descriptor(d))
                         for local, (_, d) in zip(locals_, wanted)]
                for f in reads:
                    f.wait(_READ_TIMEOUT)
            finally:
                for region in locals_:
                    region.deregister()
        return tensors

    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: Any,
                              communicator_metadata: Any) -> None:
        raise NotImplementedError("FERRY is one-sided: the receiver reads")

    def garbage_collect(self, obj_id: str, tensor_transport_meta: Any,
                        tensors: List[Any]) -> None:
        here = _here()
        with here.lock:
            regions = here.published.pop(obj_id, [])
        for region in regions:
            if region is not None:
                region.deregister()

    def abort_transport(self, obj_id: str, communicator_metadata: Any) -> None:
        pass  # can_abort_transport() is False: Ray never calls it


def register() -> None:
    """Makes tensor_transport="FERRY" available: call it before defining the actor methods that
    name it (ray.method checks the name) and before creating the actors. Registering again does
    nothing."""
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt.util import transport_manager_info

    if NAME not in transport_manager_info:
        register_tensor_transport(NAME, ["cpu"], FerryTensorTransport, torch.Tensor)
