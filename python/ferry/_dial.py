"""Connecting to a known engine: its addresses in turn, its proven id checked (the torch
backend's ranks, Ray's producers)."""

from __future__ import annotations

from typing import Optional, Sequence

from . import _ferry
from .errors import ConnectFailed, Timeout, WrongPeer


def connect_to(engine: _ferry.Engine, addresses: Sequence[str], engine_id: int) -> _ferry.Peer:
    """A connection to the engine `engine_id` at the first of `addresses` this host reaches;
    WrongPeer (the connection closed) when another engine answers there."""
    last: Optional[BaseException] = None
    for address in addresses:
        try:
            peer = engine.connect(address)
        except (ConnectFailed, Timeout) as e:
            last = e  # an interface this host cannot reach: the next one
            continue
        if peer.engine_id != engine_id:
            peer.close()
            raise WrongPeer("wrong_peer", f"{address} is engine {peer.engine_id}, not {engine_id}")
        return peer
    raise last if last is not None else ConnectFailed("connect_failed", "no address")
