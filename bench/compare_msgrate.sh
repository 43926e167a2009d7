#!/usr/bin/env bash
# Message rate: 8-byte tagged messages per second, Ferry's send/recv beside UCX's 8-byte
# active messages (`ucx_perftest -t ucp_am_bw`, the figure osu_mbw_mr and ucx_perftest report)
# on the same path: TCP loopback (UCX_TLS=tcp) and same host (Ferry's shm, UCX_TLS=posix). One
# run, interleaved, REPEAT rounds, medians and the median of the per-round ratios.
#   bash bench/compare_msgrate.sh          (after `make build`)
# Ferry runs one message in flight and eight; UCX's bandwidth test keeps its own window.
set -euo pipefail
cd "$(dirname "$0")/.."
FERRY=${FERRY:-build/release/tools/ferry}
PORT=${PORT:-15231}
REPEAT=${REPEAT:-3}
MESSAGES=${MESSAGES:-200000}

for tool in ucx_perftest python3; do
  command -v "$tool" >/dev/null || { echo "compare_msgrate: $tool missing (make deps installs it)"; exit 1; }
done
[ -x "$FERRY" ] || { echo "compare_msgrate: run 'make build' first"; exit 1; }
cleanup() { kill $(jobs -p) 2>/dev/null || true; }
trap cleanup EXIT

# UCX's 8-byte active-message rate (msg/s, overall) with UCX_TLS=$1.
ucx_rate() {
  UCX_TLS="$1" ucx_perftest -p "$PORT" >/dev/null 2>&1 &
  sleep 0.5
  UCX_TLS="$1" ucx_perftest 127.0.0.1 -p "$PORT" -t ucp_am_bw -s 8 -n "$MESSAGES" -w 1000 \
    2>/dev/null | awk '/Final:/ {print $NF}' | tail -1
  wait
}
# Ferry's 8-byte send/recv rate (ops/s) over transport $1 with $2 in flight.
ferry_rate() {
  "$FERRY" bench --transport "$1" --op send --sizes 8 --iters "$MESSAGES" --concurrency "$2" \
    --json | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["ops_per_s"])'
}

rows=""
for run in $(seq 1 "$REPEAT"); do
  row="$run"
  for pair in tcp:tcp shm:posix; do
    ferry_transport=${pair%%:*} ucx_tls=${pair##*:}
    row+=" $(ferry_rate "$ferry_transport" 1) $(ferry_rate "$ferry_transport" 8)"
    u=$(ucx_rate "$ucx_tls"); row+=" ${u:-0}"
  done
  rows+="$row"$'\n'
done

echo "$rows" | python3 -c '
import statistics, sys
runs = [list(map(float, l.split()[1:])) for l in sys.stdin if l.strip()]
def med(i): return statistics.median(r[i] for r in runs)
def ratio(a, b): return statistics.median(r[a] / r[b] for r in runs if r[b] > 0)
print(f"8-byte messages per second, medians of {len(runs)} runs; ratio = median of per-run ratios")
print("%-44s %12s %12s %7s" % ("measurement", "ferry", "UCX am_bw", "ratio"))
for i, (name, tls) in enumerate((("tcp", "tcp"), ("same host (shm)", "posix"))):
    one, eight, ucx = 3 * i, 3 * i + 1, 3 * i + 2
    for a, inflight in ((one, 1), (eight, 8)):
        label = f"{name}, {inflight} in flight vs UCX_TLS={tls}"
        print(f"{label:<44} {med(a):>12.0f} {med(ucx):>12.0f} {ratio(a, ucx):>7.2f}")
'
