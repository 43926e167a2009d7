"""Descriptors exchanged through torch.distributed, as a trainer and its peers already run:
two ranks started by torchrun gather each other's address and descriptor with
all_gather_object, then rank 0 writes into rank 1's tensor.

    torchrun --nproc-per-node 2 examples/python/torch_distributed_bootstrap.py
Run without torchrun, it starts the two ranks itself (gloo backend, this host).
"""

import os
import subprocess
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("torch_distributed_bootstrap: skipped, torch is not installed (pip install torch)")
    sys.exit(0)

import ferry


def rank_main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with ferry.Engine() as engine:
        tensor = torch.full((1024,), float(rank))
        region = engine.register(tensor, access=ferry.Access.REMOTE_WRITE)
        offers = [None, None]
        dist.all_gather_object(offers, (engine.address, region.descriptor()))
        if rank == 0:
            address, descriptor = offers[1]
            peer = engine.connect(address)
            src = engine.register(torch.full((1024,), 42.0))
            peer.write(src, descriptor).wait(timeout=10)
        dist.barrier()  # rank 0's write completed before rank 1 looks
        if rank == 1:
            assert torch.equal(tensor, torch.full((1024,), 42.0)), "rank 1: not written"
            print("rank 1: tensor written by rank 0 through Ferry")
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        rank_main()
    else:
        # The two ranks with the environment torchrun gives them (env:// rendezvous). Started
        # here rather than through torch.distributed.run, whose 1.13 (Debian's) fails on
        # Python 3.11 before starting any worker.
        env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
        ranks = [subprocess.Popen([sys.executable, __file__],
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(2)]
        sys.exit(max(rank.wait(timeout=240) for rank in ranks))
