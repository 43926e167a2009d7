"""One rank of test_distributed.py's torchrun job: every operation of the "ferry" backend,
checked against what gloo gives for the same inputs in the same job. Prints "rank N ok"."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import ferry.distributed  # noqa: F401  (registers the backend)


def check(what: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    exact = not ours.dtype.is_floating_point
    same = torch.equal(ours, theirs) if exact else torch.allclose(ours, theirs, rtol=1e-5)
    if not same:
        raise AssertionError(f"{what}: ferry {ours.flatten()[:8]} gloo {theirs.flatten()[:8]}")


def inputs(rank: int, dtype: torch.dtype, n: int) -> torch.Tensor:
    # Small integers (exact in every dtype and every reduction order), different per rank.
    values = (torch.arange(n) * 7 + rank * 3 + 1) % 5 + 1
    return values.to(dtype)


def main() -> None:
    dist.init_process_group("ferry")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "ferry"
    gloo = dist.new_group(backend="gloo")

    # Point to point: a ring, blocking and not, every size up to 4 MiB, an empty tensor too.
    right, left = (rank + 1) % size, (rank - 1) % size
    for n in (0, 1, 1000, 1 << 20):
        out = inputs(rank, torch.float32, n)
        got = torch.full((n,), -1.0)
        if rank % 2 == 0:
            dist.send(out, right, tag=n % 97)
            dist.recv(got, left, tag=n % 97)
        else:
            back = torch.full((n,), -1.0)
            dist.recv(back, left, tag=n % 97)
            dist.send(out, right, tag=n % 97)
            got = back
        check(f"send/recv {n}", got, inputs(left, torch.float32, n))
        sent = dist.isend(out, right, tag=1)
        received = dist.irecv(got, left, tag=1)
        sent.wait()
        received.wait()
        check(f"isend/irecv {n}", got, inputs(left, torch.float32, n))

    # batch_isend_irecv: 64 tensors each way around the ring, of mixed sizes and dtypes.
    shapes = [((i * 37) % 5000 + (i % 3) * 100000, (torch.float32, torch.int64, torch.uint8)[i % 3])
              for i in range(64)]
    outs = [inputs(rank + i, dtype, n) for i, (n, dtype) in enumerate(shapes)]
    ins = [torch.zeros(n, dtype=dtype) for n, dtype in shapes]
    ops = [dist.P2POp(dist.isend, t, right) for t in outs]
    ops += [dist.P2POp(dist.irecv, t, left) for t in ins]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    for i, ((n, dtype), got) in enumerate(zip(shapes, ins)):
        check(f"batch_isend_irecv {i}", got, inputs(left + i, dtype, n))

    # Collectives, each against gloo.
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        for n in (1, 1000, 300000):
            reductions = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                          dist.ReduceOp.MAX]
            if not dtype.is_floating_point:
                reductions += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
            for op in reductions:
                ours, theirs = inputs(rank, dtype, n), inputs(rank, dtype, n)
                dist.all_reduce(ours, op=op)
                dist.all_reduce(theirs, op=op, group=gloo)
                check(f"all_reduce {op} {dtype} {n}", ours, theirs)
            for root in range(size):
                ours = inputs(rank, dtype, n)
                theirs = inputs(rank, dtype, n)
                dist.broadcast(ours, root)
                dist.broadcast(theirs, root, group=gloo)
                check(f"broadcast from {root} {dtype} {n}", ours, theirs)
            ours_list = [torch.zeros(n, dtype=dtype) for _ in range(size)]
            theirs_list = [torch.zeros(n, dtype=dtype) for _ in range(size)]
            dist.all_gather(ours_list, inputs(rank, dtype, n))
            dist.all_gather(theirs_list, inputs(rank, dtype, n), group=gloo)
            for r in range(size):
                check(f"all_gather [{r}] {dtype} {n}", ours_list[r], theirs_list[r])
    work = dist.all_reduce(inputs(rank, torch.int64, 10), async_op=True)
    work.wait()
    for _ in range(3):
        dist.barrier()

    # A message shorter than the tensor that receives it is an error, as in gloo.
    if rank % 2 == 0:
        dist.send(torch.ones(4), right, tag=7)
    else:
        try:
            dist.recv(torch.zeros(8), left, tag=7)
            raise AssertionError("a 4-element message filled an 8-element tensor")
        except (RuntimeError, ferry.FerryError) as e:
            assert "the message had 16 bytes, the tensor 32" in str(e), e

    # Refusals reach the caller as errors, and the group still works after them.
    try:
        dist.send(torch.zeros(4), rank)
        raise AssertionError("a send to itself was accepted")
    except (RuntimeError, ValueError, ferry.FerryError):
        pass
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} ok", flush=True)


if __name__ == "__main__":
    sys.exit(main())
