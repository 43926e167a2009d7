"""Ferry beside the engines its users choose between, in one run, interleaved.

    bash bench/compare_engines.sh [--fast]      (make bench-engines; installs the peers first)

Each engine runs as two processes of its own (a target holding memory, an initiator timing
operations on it), with its own interpreter (`--python ENGINE=PATH`), through drivers.py.
Engines take turns within every round and the order rotates between rounds, so a busy moment
of a shared host does not fall on one engine. Shapes, all on CPU memory, both directions:
8 B / 64 KiB / 1 MiB / 64 MiB one at a time (p50 latency) and 16 in flight (GB/s), and a
1,000-entry batch of 16 KiB at scattered remote offsets (the KV-cache shape, GB/s), over each
engine's TCP path and its best same-host path. Prints each engine's median of the rounds and
the ratio Ferry / peer as speed (above 1: Ferry is faster), then the rows where a peer wins.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
KiB, MiB = 1 << 10, 1 << 20
# Memory on each side: holds 16 slots up to 16 MiB, 4 of 64 MiB (operations beyond that
# share slots), and the scattered batch.
BUFFER_BYTES = 256 * MiB
IN_FLIGHT = 16
BATCH_ENTRIES, BATCH_ENTRY_BYTES = 1000, 16 * KiB
VERIFY_BYTES = 64 * KiB
# One engine's every shape, with time to spare on a busy host; a hang ends as a failure.
PAIR_TIMEOUT_S = 300
# "ferry" registers NumPy memory as the peers do (the ratios are its); "ferry-allocate" uses
# Engine.allocate (the same-host fast path), shown beside it.
ENGINES = ["ferry", "ferry-allocate", "nixl", "mooncake"]


@dataclass(frozen=True)
class Shape:
    op: str
    size: int
    depth: int = 1  # operations in flight
    entries: int = 1  # entries of one batch

    @property
    def name(self) -> str:
        size = f"{self.size // MiB} MiB" if self.size >= MiB else (
            f"{self.size // KiB} KiB" if self.size >= KiB else f"{self.size} B")
        if self.entries > 1:
            return f"{self.op} {self.entries} x {size} scattered"
        return f"{self.op} {size}" + (f" x{self.depth} in flight" if self.depth > 1 else "")

    @property
    def latency(self) -> bool:
        """One operation at a time: its p50 latency is the figure."""
        return self.depth == 1 and self.entries == 1


def shapes(fast: bool) -> list[Shape]:
    if fast:
        return [Shape("write", 64 * KiB)]
    out = []
    for op in ("write", "read"):
        for size in (8, 64 * KiB, MiB, 64 * MiB):
            out += [Shape(op, size), Shape(op, size, depth=IN_FLIGHT)]
        out.append(Shape(op, BATCH_ENTRY_BYTES, entries=BATCH_ENTRIES))
    return out


# --- the initiator's side: times the shapes with one driver ---------------------------------

def fill(memory: Any) -> None:
    """Every page written, so that each is memory of its own before anything is timed (an
    untouched page is the kernel's one zero page until written)."""
    memory.fill(0x5A)


def verify(initiator: Any, np: Any) -> None:
    """Bytes written and read back compare equal: the driver moves real bytes."""
    pattern = np.random.default_rng(7).integers(0, 256, VERIFY_BYTES, dtype=np.uint8)
    initiator.memory[:VERIFY_BYTES] = pattern
    zero = np.zeros(1, dtype=np.int64)
    initiator.wait(initiator.post(initiator.prepare("write", zero, zero, VERIFY_BYTES, True)))
    back = np.full(1, VERIFY_BYTES, dtype=np.int64)
    initiator.wait(initiator.post(initiator.prepare("read", back, zero, VERIFY_BYTES, True)))
    if not np.array_equal(initiator.memory[VERIFY_BYTES:2 * VERIFY_BYTES], pattern):
        raise RuntimeError("bytes read back differ from the bytes written")


def measure(initiator: Any, shape: Shape, duration: float, np: Any) -> dict[str, Any]:
    one_batch = shape.depth > 1 and getattr(initiator, "ONE_BATCH_IN_FLIGHT", False)
    if shape.entries > 1:
        local = np.arange(shape.entries, dtype=np.int64) * shape.size
        remote = np.random.default_rng(1).permutation(local)
        ops = [initiator.prepare(shape.op, local, remote, shape.size, True)]
    elif one_batch:
        slots = max(1, min(shape.depth, BUFFER_BYTES // shape.size))
        offsets = (np.arange(shape.depth, dtype=np.int64) % slots) * shape.size
        ops = [initiator.prepare(shape.op, offsets, offsets, shape.size, True)]
    else:
        slots = max(1, min(shape.depth, BUFFER_BYTES // shape.size))
        ops = [initiator.prepare(shape.op, np.full(1, (i % slots) * shape.size, dtype=np.int64),
                                 np.full(1, (i % slots) * shape.size, dtype=np.int64), shape.size,
                                 shape.depth == 1)
               for i in range(shape.depth)]
    for op in ops:  # warm-up: connections, mappings, caches
        initiator.wait(initiator.post(op))
    bytes_per_post = shape.size * (shape.depth if one_batch else shape.entries)
    if shape.depth == 1 or one_batch:
        samples = []
        end = time.perf_counter() + duration
        while time.perf_counter() < end or len(samples) < 5:
            t0 = time.perf_counter()
            initiator.wait(initiator.post(ops[0]))
            samples.append(time.perf_counter() - t0)
        p50 = sorted(samples)[len(samples) // 2]
        if one_batch:  # bytes of the whole run over its time, as for a window
            return {"gbps": bytes_per_post * len(samples) / sum(samples) / 1e9}
        return {"p50_us": p50 * 1e6, "gbps": bytes_per_post / p50 / 1e9}
    # A window of `depth` operations: the oldest is waited for and posted again.
    t0 = time.perf_counter()
    end = t0 + duration
    tokens = [initiator.post(op) for op in ops]
    done = 0
    while True:
        k = done % shape.depth
        initiator.wait(tokens[k])
        done += 1
        if time.perf_counter() >= end and done >= 2 * shape.depth:
            break
        tokens[k] = initiator.post(ops[k])
    for i in range(1, shape.depth):  # drain the rest of the window
        initiator.wait(tokens[(done - 1 + i) % shape.depth])
        done += 1
    elapsed = time.perf_counter() - t0
    return {"gbps": done * bytes_per_post / elapsed / 1e9}


def run_role(args: argparse.Namespace) -> None:
    import numpy as np

    sys.path.insert(0, HERE)
    from drivers import DRIVERS

    target_cls, initiator_cls = DRIVERS[args.engine]
    if args.role == "target":
        target = target_cls(args.transport, BUFFER_BYTES)
        fill(target.memory)
        print(json.dumps(target.contact()), flush=True)
        sys.stdin.read()  # serve until the harness closes our stdin
        target.close()
        _leave(target)
        return
    initiator = initiator_cls(args.transport, json.loads(os.environ["FERRY_BENCH_CONTACT"]),
                              BUFFER_BYTES)
    fill(initiator.memory)
    verify(initiator, np)
    for shape in shapes(args.fast):
        result = measure(initiator, shape, args.duration, np)
        print(json.dumps({"shape": shape.name, **result}), flush=True)
    initiator.close()
    _leave(initiator)


def _leave(side: Any) -> None:
    if getattr(side, "EXIT_HARD", False):
        sys.stdout.flush()
        os._exit(0)


# --- the harness: pairs of processes, rounds, the table ---------------------------------------

def run_pair(args: argparse.Namespace, engine: str, transport: str) -> dict[str, dict[str, Any]]:
    python = args.python[engine]
    env = dict(os.environ)
    if not engine.startswith("ferry") and args.peer_library_path:
        env["LD_LIBRARY_PATH"] = args.peer_library_path
    role = [python, os.path.abspath(__file__), "--engine", engine, "--transport", transport,
            "--duration", str(args.duration)] + (["--fast"] if args.fast else [])
    target = subprocess.Popen(role + ["--role", "target"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = "-"
        while line and not line.startswith("{"):  # a peer's library may print first
            line = target.stdout.readline() if target.stdout else ""
        if not line:
            raise RuntimeError("target: " + _last_lines(target.communicate(timeout=30)[1]))
        env["FERRY_BENCH_CONTACT"] = line.strip()
        done = subprocess.run(role + ["--role", "initiator"], capture_output=True, text=True,
                              env=env, timeout=PAIR_TIMEOUT_S)
        results = {}
        for out in done.stdout.splitlines():
            if out.startswith("{"):
                r = json.loads(out)
                results[r.pop("shape")] = r
        if done.returncode != 0:
            raise RuntimeError("initiator: " + _last_lines(done.stderr))
        return results
    finally:
        if target.stdin:
            target.stdin.close()
        try:
            target.wait(30)
        except subprocess.TimeoutExpired:
            target.kill()


def _last_lines(text: str, n: int = 3) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " | ".join(lines[-n:]) or "exited without output"


def fmt(value: float | None, latency: bool) -> str:
    if value is None:
        return "-"
    if latency:
        return f"{value:.1f} us"
    return f"{value:.2f} GB/s" if value >= 0.1 else f"{value * 1e3:.2f} MB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=["target", "initiator"])
    parser.add_argument("--engine", choices=ENGINES)
    parser.add_argument("--transport", choices=["tcp", "same-host"])
    parser.add_argument("--python", action="append", default=[],
                        help="ENGINE=INTERPRETER for each engine to run")
    parser.add_argument("--skip", action="append", default=[],
                        help="ENGINE=REASON: an engine that could not be installed")
    parser.add_argument("--peer-library-path", default="",
                        help="LD_LIBRARY_PATH for the peers' processes (not Ferry's)")
    parser.add_argument("--transports", default="tcp,same-host",
                        help="comma-separated: tcp, same-host")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated, of those given an interpreter")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=0.5, help="seconds per shape")
    parser.add_argument("--fast", action="store_true",
                        help="one shape, one round: checks the script and each driver work")
    args = parser.parse_args()
    if args.role:
        run_role(args)
        return
    args.python = dict(p.split("=", 1) for p in args.python)
    skipped = dict(s.split("=", 1) for s in args.skip)
    if "ferry" in args.python:
        args.python.setdefault("ferry-allocate", args.python["ferry"])
    engines = [e for e in ENGINES if e in args.python and e in args.engines.split(",")]
    if "ferry" not in engines:
        sys.exit("compare_engines: --python ferry=... is required")
    peers = [e for e in engines if not e.startswith("ferry")]
    columns = [e for e in engines if e != "ferry" and e.startswith("ferry")]
    transports = args.transports.split(",")
    # values[(transport, shape, engine)] = one figure per round
    values: dict[tuple[str, str, str], list[float]] = {}
    failed: dict[str, str] = {}
    rounds = 1 if args.fast else args.rounds
    for n in range(rounds):
        for transport in transports:
            order = engines[n % len(engines):] + engines[:n % len(engines)]
            for engine in order:
                if engine in failed:
                    continue
                try:
                    results = run_pair(args, engine, transport)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failed[engine] = f"{transport}: {e}"
                    print(f"{engine} failed ({failed[engine]})", file=sys.stderr)
                    continue
                for shape in shapes(args.fast):
                    r = results[shape.name]
                    figure = r["p50_us"] if shape.latency else r["gbps"]
                    values.setdefault((transport, shape.name, engine), []).append(figure)
            print(f"round {n + 1}/{rounds} {transport} done", file=sys.stderr)

    def median(transport: str, shape: Shape, engine: str) -> float | None:
        v = values.get((transport, shape.name, engine))
        return statistics.median(v) if v else None

    print(f"Ferry / peer as speed (above 1.00: Ferry faster); medians of {rounds} round(s); "
          "one operation at a time: p50 latency, otherwise GB/s")
    header = f"{'transport':<10} {'shape':<34} {'ferry':>12}" + "".join(
        f" {c:>14}" for c in columns) + "".join(
        f" {p:>12} {'ratio':>6}" for p in peers)
    print(header)
    losses = []
    for transport in transports:
        for shape in shapes(args.fast):
            ours = median(transport, shape, "ferry")
            row = f"{transport:<10} {shape.name:<34} {fmt(ours, shape.latency):>12}"
            for c in columns:
                row += f" {fmt(median(transport, shape, c), shape.latency):>14}"
            for peer in peers:
                theirs = median(transport, shape, peer)
                ratio = None
                if ours and theirs:
                    ratio = theirs / ours if shape.latency else ours / theirs
                    if ratio < 1.0:
                        losses.append(f"{transport} {shape.name}: {ratio:.2f}x {peer}")
                row += f" {fmt(theirs, shape.latency):>12} {ratio if ratio else 0:>6.2f}"
            print(row)
    for engine, reason in skipped.items():
        print(f"{engine}: skipped ({reason})")
    for engine, reason in failed.items():
        print(f"{engine}: FAILED ({reason})")
    ran = [p for p in peers if p not in failed]
    if not ran:
        print("no peer ran: nothing compared")
    else:
        print("rows where a peer is faster: " + ("none" if not losses else "; ".join(losses)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
