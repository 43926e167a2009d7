"""write_with_imm: each write carries a number the target receives once every byte landed;
here it names the slot of a ring the target then consumes."""

import numpy as np

import ferry
from _two_process import run, serve_one

SLOTS, SLOT_BYTES = 32, 64 << 10


def target(publish):
    with ferry.Engine() as engine:
        ring = np.zeros((SLOTS, SLOT_BYTES), dtype=np.uint8)
        region = engine.register(ring, access=ferry.Access.REMOTE_WRITE)
        publish((engine.address, region.descriptor()))
        for _ in range(SLOTS):
            event = engine.next_imm(timeout=30)
            assert event is not None, "no notification"
            assert (ring[event.imm] == event.imm + 1).all(), "slot incomplete when notified"
        print(f"target: {SLOTS} slots consumed, each complete when notified")
        serve_one(engine)  # the initiator leaves once its writes completed


def initiator(offer):
    address, descriptor = offer
    with ferry.Engine(listen=False) as engine:
        peer = engine.connect(address)
        source = np.repeat(np.arange(1, SLOTS + 1, dtype=np.uint8), SLOT_BYTES)
        region = engine.register(source)
        futures = [
            peer.write_with_imm(region, descriptor, slot, local_offset=slot * SLOT_BYTES,
                                remote_offset=slot * SLOT_BYTES, length=SLOT_BYTES)
            for slot in range(SLOTS)
        ]
        for f in futures:
            f.wait(timeout=10)
        print(f"initiator: {SLOTS} slots written with notifications")


if __name__ == "__main__":
    run(target, initiator)
