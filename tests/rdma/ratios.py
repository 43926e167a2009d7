#!/usr/bin/env python3
"""Ferry-over-verbs / perftest ratios from the METRIC lines of one guest run (make bench-rdma).

A metric measured in several runs (names ending _r1, _r2, ...) counts as its best run (lowest
latency, highest bandwidth): a busy host only ever adds time, so the best run of each side is
the least disturbed one. The ratio of the medians is printed beside it, and the median of the
per-run ratios (run N of each side ran next to each other, so a slow spell of the host hits
both; one lucky run of either side does not move it).

usage: ratios.py LOG [--present]   (--present: only the rows both sides were measured for)"""
import re
import statistics
import sys

runs = {}
by_run = {}  # name -> {run number: value}
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"METRIC (\S+) ([0-9.]+) (\S+)", line)
    if m:
        value = float(m.group(2))
        if m.group(3).startswith("MB1e6"):
            value /= 1.048576  # to perftest's 2^20-byte MB
        name = re.sub(r"_r[0-9]+$", "", m.group(1))
        runs.setdefault(name, []).append((value, m.group(3)))
        run = re.search(r"_r([0-9]+)$", m.group(1))
        by_run.setdefault(name, {})[int(run.group(1)) if run else 1] = value
# The best run: the lowest latency, the highest bandwidth.
metrics = {name: (min if values[0][1] == "usec" else max)(v for v, _ in values)
           for name, values in runs.items()}
medians = {name: statistics.median(v for v, _ in values) for name, values in runs.items()}

# (label, Ferry's metric, perftest's metric, factor on perftest's figure); the last row's
# pair is stream-bench.tests', the others bench.tests'.
rows = [("write bandwidth 64 KiB", "ferry_write_bw_64k", "write_bw_64k", 1),
        ("read bandwidth 64 KiB", "ferry_read_bw_64k", "read_bw_64k", 1),
        ("write bandwidth 1 MiB", "ferry_write_bw_1m", "write_bw_1m", 1),
        ("read bandwidth 1 MiB", "ferry_read_bw_1m", "read_bw_1m", 1),
        # both: half the round trip of answered 8-byte writes, p50
        ("write latency 8 B (ping-pong / 2)", "ferry_pingpong_8", "write_lat_8", 1),
        # the same with one write prepared once and posted every round (Peer::prepare_write)
        ("  prepared write", "ferry_pingpong_prep_8", "write_lat_8", 1),
        # a write's completion needs the data there and the ack back: a full round trip
        ("write completion 8 B vs round trip", "ferry_write_lat_8", "write_lat_8", 2),
        ("read latency 8 B (completion)", "ferry_read_lat_8", "read_lat_8", 1),
        ("send bandwidth 64 KiB", "ferry_send_bw_64k", "send_bw_64k", 1),
        ("send bandwidth 1 MiB", "ferry_send_bw_1m", "send_bw_1m", 1),
        # ferry stream against ferry bench write (stream-bench.tests), not perftest
        ("stream 64 KiB w16 / ferry write x16", "ferry_stream_64k_w16", "ferry_write_bw_64k_w16",
         1)]
STREAM_ROWS = 1
tests_files = {"bench.tests": rows[:-STREAM_ROWS], "stream-bench.tests": rows[-STREAM_ROWS:]}
# A tests file ran when any of its metrics is in the log; the rows of the others are left out.
ran = [row for file_rows in tests_files.values()
       if any(k in metrics for _, ours, theirs, _ in file_rows for k in (ours, theirs))
       for row in file_rows]
print("%-36s %12s %12s %7s %9s %8s" % ("ferry over verbs vs perftest", "ferry", "perftest",
                                        "ratio", "(median)", "(pairs)"))
missing = False
printed = 0
present_only = "--present" in sys.argv[2:]
for name, ours_key, theirs_key, factor in ran:
    ours, theirs = metrics.get(ours_key), metrics.get(theirs_key)
    if present_only and (ours is None or theirs is None):
        continue
    printed += 1
    if ours is None or theirs is None or theirs == 0:
        print("%-36s %12s %12s %7s" % (name, ours, theirs, "n/a"))
        missing = True
        continue
    theirs *= factor
    of_medians = medians[ours_key] / (medians[theirs_key] * factor)
    ours_runs, theirs_runs = by_run[ours_key], by_run[theirs_key]
    pairs = [ours_runs[r] / (theirs_runs[r] * factor) for r in ours_runs if r in theirs_runs]
    print("%-36s %12.2f %12.2f %7.2f %9.2f %8.2f" % (name, ours, theirs, ours / theirs, of_medians,
                                                    statistics.median(pairs)))
print("(bandwidth in MiB/s, latency in us, best of the runs; ratio of the best runs, of the\n"
      " medians, median of the per-run ratios; emulated CPU: only the ratios mean anything)")
# Scattered batches against one contiguous transfer of the same bytes, Ferry alone (bench.tests
# ferry_scatter): bandwidth ratio, and the write()/read() call's time per entry.
scatter = sorted(n for n in runs if n.startswith("ferry_scatter_") and "_submit_" not in n)
if scatter:
    print("%-36s %12s %14s" % ("ferry over verbs, scattered batch", "vs contiguous",
                               "ns per entry"))
    for name in scatter:
        op, size = name[len("ferry_scatter_"):].rsplit("_", 1)
        submit = runs.get("ferry_scatter_submit_%s_%s" % (op, size))
        print("%-36s %12.2f %14s" % ("%s %s KiB x 1000" % (op, int(size) // 1024), medians[name],
                                     "%.1f" % min(v for v, _ in submit) if submit else "n/a"))
# The emulator through a verifying stream (stream-bench.tests emulate).
emulate = {n[len("emulate_"):]: metrics[n] for n in runs if n.startswith("emulate_")}
if emulate:
    print("emulator at %.0f MB/s over verbs: frames %d of %d sent, lost %d, bad CRC %d, late (>1 ms)"
          " %d, latency p50 %.1f us p99 %.1f us" % tuple(emulate.get(k, float("nan")) for k in (
              "rate_MBps", "frames", "frames_sent", "lost", "bad_crc", "late", "latency_p50_us",
              "latency_p99_us")))
if printed == 0:
    print("ratios.py: no pair of Ferry and its peer was measured in " + sys.argv[1])
sys.exit(1 if missing or printed == 0 else 0)
