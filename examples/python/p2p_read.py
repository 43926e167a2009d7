"""One-sided read: the initiator reads the target's array; the target's CPU is not involved
over RDMA, and only checks access over TCP."""

import numpy as np

import ferry
from _two_process import run, serve_one

N = 1 << 20


def target(publish):
    with ferry.Engine() as engine:
        data = np.arange(N, dtype=np.int32)
        region = engine.register(data, access=ferry.Access.REMOTE_READ)
        publish((engine.address, region.descriptor()))
        serve_one(engine)


def initiator(offer):
    address, descriptor = offer
    with ferry.Engine(listen=False) as engine:
        peer = engine.connect(address)
        out = np.zeros(N, dtype=np.int32)
        region = engine.register(out)
        peer.read(region, descriptor).wait(timeout=10)
        assert np.array_equal(out, np.arange(N, dtype=np.int32))
        print(f"initiator: read {out.nbytes >> 20} MiB, checked")


if __name__ == "__main__":
    run(target, initiator)
