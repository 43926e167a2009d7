"""torch tensors in and out without copies: the target registers a tensor (through DLPack),
the initiator writes a tensor of its own into it and reads it back into a third one."""

import sys

try:
    import torch
except ImportError:
    print("torch_tensors: skipped, torch is not installed (pip install torch)")
    sys.exit(0)

import ferry
from _two_process import run, serve_one

SHAPE = (256, 1024)


def target(publish):
    with ferry.Engine() as engine:
        weights = torch.zeros(SHAPE, dtype=torch.float16)
        region = engine.register(weights, access=ferry.Access.REMOTE_READ_WRITE)
        publish((engine.address, region.descriptor()))
        serve_one(engine)
        expected = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float32).reshape(SHAPE).half()
        assert torch.equal(weights, expected), "target: the tensor differs"
        print("target: tensor updated in place by the peer")


def initiator(offer):
    address, descriptor = offer
    with ferry.Engine(listen=False) as engine:
        peer = engine.connect(address)
        update = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float32).reshape(SHAPE).half()
        back = torch.empty(SHAPE, dtype=torch.float16)
        src, dst = engine.register(update), engine.register(back)
        peer.write(src, descriptor).wait(timeout=10)
        peer.read(dst, descriptor).wait(timeout=10)
        assert torch.equal(back, update)
        print(f"initiator: {update.numel() * 2 >> 10} KiB tensor written and read back")


if __name__ == "__main__":
    run(target, initiator)
