"""One rank of bench/compare_torch.sh: batch_isend_irecv of COUNT tensors of SIZE bytes from
rank 0 to rank 1, over the "ferry" backend and over gloo, rounds interleaved; rank 0 prints one
JSON line per backend with the median GB/s of its rounds. Every round's bytes are checked once."""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import ferry.distributed  # noqa: F401  (registers the backend)

COUNT = int(os.environ.get("BATCH_COUNT", "64"))
SIZE = int(os.environ.get("BATCH_BYTES", str(1 << 20)))
ROUNDS = int(os.environ.get("BATCH_ROUNDS", "5"))
BATCHES = int(os.environ.get("BATCH_REPEATS", "10"))  # batches per round


def one_round(group, tensors, rank: int) -> float:
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(BATCHES):
        op = dist.isend if rank == 0 else dist.irecv
        reqs = dist.batch_isend_irecv([dist.P2POp(op, t, 1 - rank, group) for t in tensors])
        for r in reqs:
            r.wait()
    dist.barrier(group=group)  # the receiver has every byte
    return COUNT * SIZE * BATCHES / (time.perf_counter() - start) / 1e9


def main() -> None:
    dist.init_process_group("ferry")
    rank = dist.get_rank()
    groups = {"ferry": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    tensors = [torch.full((SIZE,), (i + 1) % 251 if rank == 0 else 0, dtype=torch.uint8)
               for i in range(COUNT)]
    rates: dict[str, list[float]] = {name: [] for name in groups}
    for r in range(ROUNDS):
        for name in (list(groups) if r % 2 == 0 else list(reversed(groups))):
            if rank == 1:
                for t in tensors:
                    t.zero_()
            rates[name].append(one_round(groups[name], tensors, rank))
            if rank == 1 and r == 0:
                for i, t in enumerate(tensors):
                    assert bool((t == (i + 1) % 251).all()), f"{name}: tensor {i} differs"
    if rank == 0:
        for name, values in rates.items():
            print(json.dumps({"backend": name, "gbps": statistics.median(values),
                              "rounds": [round(v, 3) for v in values]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
