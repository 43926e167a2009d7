"""What Python adds over the C++ API, measured side by side in one run.

    python bench/python_overhead.py [path/to/ferry]     (make bench-python)

1. An 8-byte write, p50 of waited round trips: `ferry bench` (C++) against the same loop
   through the Python package, both against a target in another process. Python passes the
   peer's descriptor as a ferry.Descriptor (decoded once, what users are told to do); the
   bytes form is measured too.
2. A 10,000-entry page-table batch of 64-byte entries, p50: `ferry bench --batch 10000`
   against `peer.write(..., local_offset=array, remote_offset=array, length=64)`.

The host may be shared: C++ and Python take turns for ROUNDS rounds, and each figure is the
median of the rounds' p50s (the difference: the median of the rounds' differences).
Prints `<what> ... ratio <x.xx>` lines and the absolute difference.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time

import numpy as np

import ferry

ENTRIES, ENTRY_BYTES = 10_000, 64
SMALL_ITERS, BATCH_ITERS = 10_000, 100
ROUNDS = 5


def target(conn, length: int = ENTRIES * ENTRY_BYTES * 2, **options) -> None:
    """A target process: an engine (`options` as Engine() takes them) with a region of `length`
    bytes others may read and write; sends its address and descriptor, serves one peer."""
    with ferry.Engine(**options) as engine:
        buf = np.zeros(length, dtype=np.uint8)
        region = engine.register(buf, access=ferry.Access.REMOTE_READ_WRITE)
        conn.send((engine.address, region.descriptor()))
        peer = engine.accept(60)
        while peer is not None and peer.connected:
            time.sleep(0.01)


def p50(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def python_side(bytes_first: bool) -> tuple[float, float, float]:
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=target, args=(theirs,))
    child.start()
    address, blob = ours.recv()
    try:
        with ferry.Engine(listen=False) as engine:
            peer = engine.connect(address)
            src = engine.register(np.ones(ENTRIES * ENTRY_BYTES, dtype=np.uint8))
            remote = ferry.Descriptor(blob)

            def small_p50(descriptor: ferry.Descriptor | bytes) -> float:
                small = []
                for i in range(SMALL_ITERS + 1000):
                    t0 = time.perf_counter()
                    peer.write(src, descriptor, length=8).wait(10)
                    if i >= 1000:
                        small.append(time.perf_counter() - t0)
                return p50(small)

            # Each form goes first in every other round: neither gains from a warmer engine.
            if bytes_first:
                small_bytes, small_desc = small_p50(blob), small_p50(remote)
            else:
                small_desc, small_bytes = small_p50(remote), small_p50(blob)
            offsets = np.arange(ENTRIES, dtype=np.int64) * ENTRY_BYTES
            batch = []
            for i in range(BATCH_ITERS + 3):
                t0 = time.perf_counter()
                peer.write(src, remote, local_offset=offsets, remote_offset=offsets,
                           length=ENTRY_BYTES).wait(30)
                if i >= 3:
                    batch.append(time.perf_counter() - t0)
    finally:
        child.join(30)
    return small_desc * 1e6, small_bytes * 1e6, p50(batch) * 1e6


def cpp_side(ferry_cli: str, *args: str) -> float:
    out = subprocess.run([ferry_cli, "bench", "--json", "--op", "write", *args],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["p50_us"]


def main() -> None:
    ferry_cli = sys.argv[1] if len(sys.argv) > 1 else "build/release/tools/ferry"
    rounds: list[tuple[float, float, float, float, float]] = []
    for n in range(ROUNDS):
        cpp_small = cpp_side(ferry_cli, "--sizes", "8", "--iters", str(SMALL_ITERS))
        cpp_batch = cpp_side(ferry_cli, "--sizes", str(ENTRY_BYTES), "--batch", str(ENTRIES),
                             "--iters", str(BATCH_ITERS))
        rounds.append((cpp_small, cpp_batch, *python_side(bytes_first=n % 2 == 1)))
    med = [statistics.median(r[k] for r in rounds) for k in range(5)]
    cpp_small, cpp_batch, py_small, py_bytes, py_batch = med
    add_small = statistics.median(r[2] - r[0] for r in rounds)
    add_bytes = statistics.median(r[3] - r[0] for r in rounds)
    add_entry_ns = statistics.median((r[4] - r[1]) * 1e3 / ENTRIES for r in rounds)
    print(f"{ROUNDS} rounds, medians of the rounds' p50s")
    print(f"8-byte write p50: C++ {cpp_small:.2f} us, Python {py_small:.2f} us, "
          f"Python adds {add_small:.2f} us ... ratio {py_small / cpp_small:.2f} vs C++")
    print(f"8-byte write p50, descriptor as bytes: Python {py_bytes:.2f} us, "
          f"Python adds {add_bytes:.2f} us ... ratio {py_bytes / cpp_small:.2f} vs C++")
    print(f"{ENTRIES}-entry page-table batch p50: C++ {cpp_batch:.0f} us, Python {py_batch:.0f} us, "
          f"Python adds {add_entry_ns:.1f} ns per entry ... ratio {py_batch / cpp_batch:.2f} vs C++")


if __name__ == "__main__":
    main()
