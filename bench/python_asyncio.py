"""asyncio against waiting, measured side by side in one run.

    python bench/python_asyncio.py [path/to/ferry]      (make bench-python)

For each of shm and tcp, against a target engine in another process:
1. An 8-byte write, p50: awaited in an asyncio task against `.wait()`. Goal: ratio <= 1.5.
2. 1,000 8-byte writes in flight, each awaited, against the same 1,000 posted and waited with
   `.wait()` (waiting in C++), both from Python. Goal: ratio >= 0.8. Also shown: the same
   writes awaited each in its own task (`asyncio.gather` of coroutines, as an asyncio server's
   requests would be), and `ferry bench --concurrency 1000` (C++ posting and waiting them).

Each figure is the median of ROUNDS rounds (the host may be shared; the C++ and Python sides
take turns). Prints `<what> ... ratio <x.xx>` lines.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time

import numpy as np

import ferry
from python_overhead import p50, target

SMALL_ITERS, WARMUP = 5_000, 500
IN_FLIGHT, BATCHES = 1_000, 20
ROUNDS = 5


def python_side(transport: str) -> tuple[float, float, float, float, float]:
    """8-byte write p50 waited and awaited (us); writes per second with 1,000 in flight waited,
    awaited each, awaited each in its own task."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=target, args=(theirs, IN_FLIGHT * 8),
                        kwargs={"transports": [transport]})
    child.start()
    address, blob = ours.recv()
    try:
        with ferry.Engine(listen=False, transports=[transport]) as engine:
            peer = engine.connect(address)
            src = engine.register(np.ones(IN_FLIGHT * 8, np.uint8))
            remote = ferry.Descriptor(blob)
            waited = []
            for i in range(SMALL_ITERS + WARMUP):
                t0 = time.perf_counter()
                peer.write(src, remote, length=8).wait(10)
                if i >= WARMUP:
                    waited.append(time.perf_counter() - t0)

            async def awaited_p50() -> float:
                samples = []
                for i in range(SMALL_ITERS + WARMUP):
                    t0 = time.perf_counter()
                    await peer.write(src, remote, length=8)
                    if i >= WARMUP:
                        samples.append(time.perf_counter() - t0)
                return p50(samples)

            def post() -> list[ferry.Future]:
                return [peer.write(src, remote, local_offset=i * 8, remote_offset=i * 8,
                                   length=8) for i in range(IN_FLIGHT)]

            def waited_rate() -> float:
                t0 = time.perf_counter()
                for _ in range(BATCHES):
                    for future in post():
                        future.wait(10)
                return BATCHES * IN_FLIGHT / (time.perf_counter() - t0)

            async def one_write(i: int) -> int:
                return await peer.write(src, remote, local_offset=i * 8, remote_offset=i * 8,
                                        length=8)

            async def awaited_rates() -> tuple[float, float]:
                for future in post():  # warm-up
                    await future
                t0 = time.perf_counter()
                for _ in range(BATCHES):
                    for future in post():
                        await future
                each = BATCHES * IN_FLIGHT / (time.perf_counter() - t0)
                t0 = time.perf_counter()
                for _ in range(BATCHES):
                    await asyncio.gather(*(one_write(i) for i in range(IN_FLIGHT)))
                tasks = BATCHES * IN_FLIGHT / (time.perf_counter() - t0)
                return each, tasks

            awaited = asyncio.run(awaited_p50())
            waited_r = waited_rate()
            each, tasks = asyncio.run(awaited_rates())
    finally:
        child.join(30)
    return p50(waited) * 1e6, awaited * 1e6, waited_r, each, tasks


def cpp_rate(ferry_cli: str, transport: str) -> float:
    out = subprocess.run([ferry_cli, "bench", "--json", "--op", "write", "--sizes", "8",
                          "--concurrency", str(IN_FLIGHT), "--iters", str(BATCHES * IN_FLIGHT),
                          "--transport", transport],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["ops_per_s"]


def main() -> None:
    ferry_cli = sys.argv[1] if len(sys.argv) > 1 else "build/release/tools/ferry"
    for transport in ("shm", "tcp"):
        rounds = [(cpp_rate(ferry_cli, transport), *python_side(transport))
                  for _ in range(ROUNDS)]
        cpp, waited, awaited, waited_r, each, tasks = (
            statistics.median(r[k] for r in rounds) for k in range(6))
        print(f"{transport}: 8-byte write p50: .wait() {waited:.1f} us, await {awaited:.1f} us "
              f"... ratio {awaited / waited:.2f} (goal <= 1.5)")
        print(f"{transport}: {IN_FLIGHT} 8-byte writes in flight: .wait() {waited_r / 1e3:.0f}k "
              f"ops/s, awaited {each / 1e3:.0f}k ops/s ... ratio {each / waited_r:.2f} "
              f"(goal >= 0.8)")
        print(f"{transport}:   the same, a task per write: {tasks / 1e3:.0f}k ops/s ... ratio "
              f"{tasks / waited_r:.2f}; C++ (ferry bench --concurrency {IN_FLIGHT}) "
              f"{cpp / 1e3:.0f}k ops/s, awaited/C++ {each / cpp:.2f}")


if __name__ == "__main__":
    main()
