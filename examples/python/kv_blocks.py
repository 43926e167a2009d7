"""Page-table batches, as a KV cache moves them: thousands of fixed-size blocks at scattered
slots, given as integer arrays and turned into one C++ batch without a Python loop."""

import time

import numpy as np

import ferry
from _two_process import run, serve_one

BLOCKS, BLOCK_BYTES, POOL = 4096, 4096, 8192  # blocks moved, block size, target pool slots


def target(publish):
    with ferry.Engine() as engine:
        pool = np.zeros((POOL, BLOCK_BYTES), dtype=np.uint8)
        region = engine.register(pool, access=ferry.Access.REMOTE_READ_WRITE)
        publish((engine.address, region.descriptor()))
        serve_one(engine)


def initiator(offer):
    address, descriptor = offer
    rng = np.random.default_rng(1)
    with ferry.Engine(listen=False) as engine:
        peer = engine.connect(address)
        cache = rng.integers(0, 256, size=(BLOCKS, BLOCK_BYTES), dtype=np.uint8)
        local = engine.register(cache)
        # The page table: which local block goes to which remote slot.
        src_blocks = rng.permutation(BLOCKS)
        dst_slots = rng.choice(POOL, size=BLOCKS, replace=False)
        start = time.perf_counter()
        peer.write(local, descriptor, local_offset=src_blocks * BLOCK_BYTES,
                   remote_offset=dst_slots * BLOCK_BYTES, length=BLOCK_BYTES).wait(timeout=30)
        seconds = time.perf_counter() - start
        # Read them back in another order into a fresh buffer and compare.
        back = np.zeros_like(cache)
        back_region = engine.register(back)
        peer.read(back_region, descriptor, local_offset=np.arange(BLOCKS) * BLOCK_BYTES,
                  remote_offset=dst_slots * BLOCK_BYTES, length=BLOCK_BYTES).wait(timeout=30)
        assert np.array_equal(back, cache[src_blocks]), "blocks differ"
        print(f"initiator: {BLOCKS} scattered {BLOCK_BYTES >> 10} KiB blocks in one call, "
              f"{BLOCKS * BLOCK_BYTES / seconds / 1e9:.2f} GB/s, read back and checked")


if __name__ == "__main__":
    run(target, initiator)
