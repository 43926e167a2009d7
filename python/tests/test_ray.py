"""Ferry as Ray's tensor transport (ferry.ray_transport) on a local Ray cluster: actors hand
each other KV blocks by reference, the bytes go through Ferry, and Ray's reference counting ends
the producer's registrations. make test runs it in a venv with Ray (make test-ray)."""

from __future__ import annotations

import os
import time

import pytest

if os.environ.get("FERRY_REQUIRE_RAY"):
    import ray  # noqa: F401  (make test-ray: a missing Ray fails instead of skipping)
ray = pytest.importorskip("ray")
pytest.importorskip("ray.experimental.rdt")
torch = pytest.importorskip("torch")

import ferry.ray_transport  # noqa: E402

ferry.ray_transport.register()  # before any method names the transport

BLOCKS, BLOCK_ELEMENTS = 8, 64 * 1024  # 8 blocks of 512 KiB (int64)


def expected_block(layer: int, i: int) -> "torch.Tensor":
    return torch.arange(BLOCK_ELEMENTS, dtype=torch.int64) * (layer + 1) + i


@ray.remote
class Prefill:
    @ray.method(tensor_transport="FERRY")
    def kv_blocks(self, layer: int) -> list:
        return [expected_block(layer, i) for i in range(BLOCKS)] + [torch.empty(0)]

    def registered(self) -> int:
        here = ferry.ray_transport._process
        if here is None:
            return 0
        return sum(r is not None for regions in here.published.values() for r in regions)


# A receiver needs Ray's transfer thread too, which only methods naming a transport or this
# option give an actor.
@ray.remote(enable_tensor_transport=True)
class Decode:
    def take(self, blocks: list) -> list:
        return [int(b.sum()) for b in blocks[:-1]] + [blocks[-1].numel()]

    def connections(self) -> int:
        here = ferry.ray_transport._process
        return 0 if here is None else len(here.peers)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_actors_move_kv_blocks_through_ferry_and_release_them(cluster):
    prefill, decode = Prefill.remote(), Decode.remote()
    sums = [[int(expected_block(layer, i).sum()) for i in range(BLOCKS)] + [0]
            for layer in range(3)]
    refs = [prefill.kv_blocks.remote(layer) for layer in range(3)]
    for layer, ref in enumerate(refs):
        assert ray.get(decode.take.remote(ref), timeout=120) == sums[layer]
    # One connection from the consumer to the producer carried them (not Ray's object store).
    assert ray.get(decode.connections.remote()) == 1
    assert ray.get(prefill.registered.remote()) == 3 * BLOCKS
    del ref, refs
    deadline = time.monotonic() + 60
    while ray.get(prefill.registered.remote()) != 0:
        assert time.monotonic() < deadline, "the producer's registrations outlived the objects"
        time.sleep(0.2)
