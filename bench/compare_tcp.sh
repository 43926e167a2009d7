#!/usr/bin/env bash
# Ferry over TCP side by side with iperf3, UCX (UCX_TLS=tcp) and a raw TCP ping-pong, all on
# loopback in one run, printing ratios. Absolute numbers on shared 2-core machines are noisy;
# the ratios measured together are what docs/performance.md records.
#   bash bench/compare_tcp.sh            (after `make build`)
set -euo pipefail
cd "$(dirname "$0")/.."
FERRY=${FERRY:-build/release/tools/ferry}
PINGPONG=${PINGPONG:-build/release/bench/tcp_pingpong}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
PORT=${PORT:-15201}

for tool in iperf3 ucx_perftest python3; do
  command -v "$tool" >/dev/null || { echo "compare_tcp: $tool missing (make deps installs it)"; exit 1; }
done
[ -x "$FERRY" ] && [ -x "$PINGPONG" ] || { echo "compare_tcp: run 'make build' first"; exit 1; }

cleanup() { kill $(jobs -p) 2>/dev/null || true; }
trap cleanup EXIT
REPEAT=${REPEAT:-3}

# UCX over TCP at 1 MiB: bandwidth of one of its tests.
ucx_bw() {  # test-name
  UCX_TLS=tcp ucx_perftest -p "$PORT" >/dev/null 2>&1 &
  sleep 0.5
  UCX_TLS=tcp ucx_perftest 127.0.0.1 -p "$PORT" -t "$1" -s 1048576 -n 2000 -w 50 2>/dev/null |
    awk '/Final:/ {print $(NF-2)}' | tail -1
  wait
}
pick() {  # json-lines op size field
  echo "$1" | python3 -c "
import json,sys
for line in sys.stdin:
    r = json.loads(line)
    if r['op'] == '$2' and r['size'] == $3: print(r['$4'])"
}

rows=""
scatter_rows=""
for run in $(seq 1 "$REPEAT"); do
  # iperf3 -l 1M: the single-stream loopback TCP ceiling.
  iperf3 -s -p "$PORT" -1 >/dev/null 2>&1 &
  sleep 0.5
  iperf_mbs=$(iperf3 -c 127.0.0.1 -p "$PORT" -l 1M -t "$SECONDS_PER_RUN" -J |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6, 1))')
  wait
  ucx_tag=$(ucx_bw tag_bw); ucx_am=$(ucx_bw ucp_am_bw); ucx_put=$(ucx_bw ucp_put_bw)
  rtt=$("$PINGPONG" 8 20000 | awk '/rtt_p50_us/ {print $2}')
  # One operation at a time for 8 B latency and 64 MiB; 1 MiB with 8 in flight, as UCX's
  # bandwidth tests keep a window of messages in flight.
  single=$("$FERRY" bench --transport tcp --op write,read --sizes 8,67108864 --json)
  window=$("$FERRY" bench --transport tcp --op write,read --sizes 1048576 --concurrency 8 --json)
  # Scattered batches: 10000 entries of 4 KiB and 16 KiB at shuffled offsets, each beside one
  # contiguous transfer of the same bytes (ratio and write()/read() time per entry).
  scatter=$("$FERRY" bench --transport tcp --op write,read --sizes 4K,16K --scatter 10000 --json)
  scatter_rows+=$(echo "$scatter" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if "ratio" in r:
        print(r["op"], r["size"], r["ratio"], r["submit_ns_per_entry"])')$'\n'
  rows+="$run $(pick "$single" write 67108864 mb_per_s) $(pick "$single" read 67108864 mb_per_s)"
  rows+=" $(pick "$window" write 1048576 mb_per_s) $(pick "$window" read 1048576 mb_per_s)"
  rows+=" $(pick "$single" write 8 p50_us) $iperf_mbs ${ucx_tag:-0} ${ucx_am:-0} ${ucx_put:-0} $rtt"$'\n'
done

echo "$rows" | python3 -c '
import statistics, sys
runs = [list(map(float, l.split()[1:])) for l in sys.stdin if l.strip()]
def med(i): return statistics.median(r[i] for r in runs)
def ratio(a, b): return statistics.median(r[a] / r[b] for r in runs if r[b] > 0)
W64, R64, W1, R1, LAT, IPERF, TAG, AM, PUT, RTT = range(10)
for r in runs:
    r.append(max(r[TAG], r[AM]))
BEST = 10
rows = [
    ("write 64 MiB MB/s vs iperf3 -l 1M", W64, IPERF),
    ("read 64 MiB MB/s vs iperf3 -l 1M", R64, IPERF),
    ("write 1 MiB x8 MB/s vs UCX tcp best (tag/am)", W1, BEST),
    ("read 1 MiB x8 MB/s vs UCX tcp best (tag/am)", R1, BEST),
    ("write 1 MiB x8 MB/s vs UCX tcp put", W1, PUT),
    ("write 8 B p50 us vs TCP ping-pong p50 RTT", LAT, RTT),
]
print(f"medians of {len(runs)} runs; ratio = median of per-run ratios")
print("%-46s %10s %10s %7s" % ("measurement", "ferry", "peer", "ratio"))
for name, a, b in rows:
    print(f"{name:<46} {med(a):>10.1f} {med(b):>10.1f} {ratio(a, b):>7.2f}")
print(f"(UCX tcp medians: tag_bw {med(TAG):.0f}, am_bw {med(AM):.0f}, put_bw {med(PUT):.0f} MB/s)")
'
echo "$scatter_rows" | python3 -c '
import statistics, sys
by = {}
for line in sys.stdin:
    if line.strip():
        op, size, ratio, ns = line.split()
        by.setdefault((op, int(size)), []).append((float(ratio), float(ns)))
print("%-46s %10s %10s" % ("scattered x10000 vs contiguous (same bytes)", "ratio", "ns/entry"))
for (op, size), v in sorted(by.items()):
    print("%-46s %10.2f %10.1f" % (f"{op} {size // 1024} KiB entries", statistics.median(r for r, _ in v),
                                   statistics.median(n for _, n in v)))
'
