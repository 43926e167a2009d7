#!/usr/bin/env python3
"""Ferry-over-verbs / perftest ratios from the METRIC lines of one guest run (make bench-rdma)."""
import re
import sys

metrics = {}
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"METRIC (\S+) ([0-9.]+) (\S+)", line)
    if m:
        value = float(m.group(2))
        if m.group(3).startswith("MB1e6"):
            value /= 1.048576  # to perftest's 2^20-byte MB
        metrics[m.group(1)] = value

rows = [("write bandwidth 64 KiB", "write_bw_64k", True), ("read bandwidth 64 KiB", "read_bw_64k", True),
        ("write bandwidth 1 MiB", "write_bw_1m", True), ("read bandwidth 1 MiB", "read_bw_1m", True),
        ("write latency 8 B (p50 vs typical)", "write_lat_8", False)]
print("%-36s %12s %12s %7s" % ("ferry over verbs vs perftest", "ferry", "perftest", "ratio"))
missing = False
for name, key, _ in rows:
    ours, theirs = metrics.get("ferry_" + key), metrics.get(key)
    if ours is None or theirs is None or theirs == 0:
        print("%-36s %12s %12s %7s" % (name, ours, theirs, "n/a"))
        missing = True
        continue
    print("%-36s %12.2f %12.2f %7.2f" % (name, ours, theirs, ours / theirs))
print("(bandwidth in MiB/s, latency in us; emulated CPU: only the ratios mean anything)")
sys.exit(1 if missing else 0)
