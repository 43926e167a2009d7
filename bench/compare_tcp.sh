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

# iperf3 -l 1M: the single-stream loopback TCP ceiling.
iperf3 -s -p "$PORT" -1 >/dev/null 2>&1 &
sleep 0.5
iperf_mbs=$(iperf3 -c 127.0.0.1 -p "$PORT" -l 1M -t "$SECONDS_PER_RUN" -J |
  python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6, 1))')
wait

# UCX over TCP, its best paths (tag and active-message bandwidth) at 1 MiB.
ucx_bw() {  # test-name
  UCX_TLS=tcp ucx_perftest -p "$PORT" >/dev/null 2>&1 &
  sleep 0.5
  UCX_TLS=tcp ucx_perftest 127.0.0.1 -p "$PORT" -t "$1" -s 1048576 -n 2000 -w 50 2>/dev/null |
    awk '/Final:/ {print $(NF-2)}' | tail -1
  wait
}
ucx_tag_mbs=$(ucx_bw tag_bw)
ucx_am_mbs=$(ucx_bw ucp_am_bw)
ucx_put_mbs=$(ucx_bw ucp_put_bw)

ping=$("$PINGPONG" 8 20000)
rtt_p50=$(echo "$ping" | awk '/rtt_p50_us/ {print $2}')

ferry_json=$("$FERRY" bench --op write,read --sizes 8,1048576,67108864 --json)
pick() {  # op size field
  echo "$ferry_json" | python3 -c "
import json,sys
for line in sys.stdin:
    r = json.loads(line)
    if r['op'] == '$1' and r['size'] == $2: print(r['$3'])"
}
w1=$(pick write 1048576 mb_per_s); r1=$(pick read 1048576 mb_per_s)
w64=$(pick write 67108864 mb_per_s); r64=$(pick read 67108864 mb_per_s)
lat8=$(pick write 8 p50_us)

ratio() { python3 -c "print(f'{float($1)/float($2):.2f}')"; }
ucx_best=$(python3 -c "print(max(float('${ucx_tag_mbs:-0}'), float('${ucx_am_mbs:-0}')))")

printf '%-44s %12s %12s %8s\n' "measurement" "ferry" "peer" "ratio"
printf '%-44s %12s %12s %8s\n' "write 64 MiB MB/s vs iperf3 -l 1M" "$w64" "$iperf_mbs" "$(ratio "$w64" "$iperf_mbs")"
printf '%-44s %12s %12s %8s\n' "read 64 MiB MB/s vs iperf3 -l 1M" "$r64" "$iperf_mbs" "$(ratio "$r64" "$iperf_mbs")"
printf '%-44s %12s %12s %8s\n' "write 1 MiB MB/s vs UCX tcp best (tag/am)" "$w1" "$ucx_best" "$(ratio "$w1" "$ucx_best")"
printf '%-44s %12s %12s %8s\n' "read 1 MiB MB/s vs UCX tcp best (tag/am)" "$r1" "$ucx_best" "$(ratio "$r1" "$ucx_best")"
printf '%-44s %12s %12s %8s\n' "write 1 MiB MB/s vs UCX tcp put" "$w1" "${ucx_put_mbs:-0}" "$(ratio "$w1" "${ucx_put_mbs:-1}")"
printf '%-44s %12s %12s %8s\n' "write 8 B p50 us vs TCP ping-pong p50 RTT" "$lat8" "$rtt_p50" "$(ratio "$lat8" "$rtt_p50")"
echo "(UCX tcp: tag_bw ${ucx_tag_mbs:-n/a} MB/s, am_bw ${ucx_am_mbs:-n/a} MB/s, put_bw ${ucx_put_mbs:-n/a} MB/s)"
