"""One-sided write: the initiator writes a NumPy array into the target's registered array."""

import numpy as np

import ferry
from _two_process import run, serve_one

N = 1 << 20


def target(publish):
    with ferry.Engine() as engine:
        data = np.zeros(N, dtype=np.float32)
        region = engine.register(data, access=ferry.Access.REMOTE_WRITE)
        publish((engine.address, region.descriptor()))
        serve_one(engine)
        assert np.array_equal(data, np.arange(N, dtype=np.float32)), "target: wrong data"
        print(f"target: {data.nbytes >> 20} MiB written by the peer, checked")


def initiator(offer):
    address, descriptor = offer
    with ferry.Engine(listen=False) as engine:
        peer = engine.connect(address)
        src = np.arange(N, dtype=np.float32)
        region = engine.register(src)
        written = peer.write(region, descriptor).wait(timeout=10)
        print(f"initiator: wrote {written} bytes over {peer.transport}")


if __name__ == "__main__":
    run(target, initiator)
