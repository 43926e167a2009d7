"""Fixtures: two engines in this process, connected (the two-process runs are the examples)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

import ferry

# `make test` installs torch and sets FERRY_REQUIRE_TORCH: there a missing torch fails the run
# instead of skipping the tensor tests and examples.
if os.environ.get("FERRY_REQUIRE_TORCH"):
    import torch  # noqa: F401

WAIT = 20.0  # seconds: generous, sanitizer and loaded machines are slow; no test depends on it


def config(**extra):
    return dict(peer_timeout=5.0, connect_timeout=5.0, wait_spin=0.0, **extra)


@dataclass
class Pair:
    target: ferry.Engine
    initiator: ferry.Engine
    peer: ferry.Peer          # the initiator's view of the target
    target_peer: ferry.Peer   # the target's view of the initiator


@pytest.fixture
def pair():
    target = ferry.Engine(**config())
    initiator = ferry.Engine(**config(listen=False))
    peer = initiator.connect(target.address)
    target_peer = target.accept(WAIT)
    assert target_peer is not None
    yield Pair(target, initiator, peer, target_peer)
    initiator.shutdown()
    target.shutdown()
