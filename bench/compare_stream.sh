#!/usr/bin/env bash
# ferry stream beside ferry bench on this host, in one run, printing ratios: a stream of 64 KiB
# frames from the built-in generator, WINDOW writes in flight into a ring of 4 x WINDOW slots,
# against `ferry bench --op write` of 64 KiB with WINDOW in flight; then the emulator at a fixed
# rate below that for EMULATE_SECONDS, with the receiver's frame checks (lost, late, latency
# p99); then the 8-byte write p50 of `ferry bench` with metrics counted and not, METRICS_PAIRS runs of each, alternated.
#   bash bench/compare_stream.sh            (after `make build`)
set -euo pipefail
cd "$(dirname "$0")/.."
FERRY=${FERRY:-build/release/tools/ferry}
REPEAT=${REPEAT:-3}
TRANSPORTS=${TRANSPORTS:-tcp shm}
WINDOW=${WINDOW:-16}
SLOTS=$((4 * WINDOW))  # the ring: credits come back while the window's writes go
STREAM_BYTES=${STREAM_BYTES:-2G}
EMULATE_SECONDS=${EMULATE_SECONDS:-60}
METRICS_PAIRS=${METRICS_PAIRS:-8}
EMULATE_SHARE=${EMULATE_SHARE:-0.15}  # of the stream's rate: on 2 cores the emulator, both stream ends and two
# CRC32C passes share them; at 0.5 every frame was late, the emulator itself behind its pace
[ -x "$FERRY" ] || { echo "compare_stream: run 'make build' first"; exit 1; }
command -v python3 >/dev/null || { echo "compare_stream: python3 missing"; exit 1; }

tmp=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

field() {  # json-line key
  python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}
summary() { grep '"kind":"summary"' "$1" | tail -1; }

# A receiver in the background; prints its address once it listens.
start_receiver() {  # transport out-file extra-args...
  local transport=$1 out=$2
  shift 2
  "$FERRY" stream --listen 127.0.0.1:0 --transport "$transport" --slots "$SLOTS" \
    --slot-bytes 65552 --json --interval 0 "$@" >"$out" 2>&1 &
  for _ in $(seq 100); do
    grep -q '^listening on ' "$out" 2>/dev/null && break
    sleep 0.05
  done
  sed -n 's/^listening on //p' "$out"
}

rows=""
for run in $(seq 1 "$REPEAT"); do
  for t in $TRANSPORTS; do
    bench=$("$FERRY" bench --transport "$t" --op write --sizes 64K --concurrency "$WINDOW" \
      --iters 20000 --json | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["mb_per_s"])')
    # No --verify here: raw transfers check nothing either (the emulator run below does).
    at=$(start_receiver "$t" "$tmp/rx.log")
    "$FERRY" stream --connect "$at" --transport "$t" --window "$WINDOW" --source gen --frame 64K \
      --bytes "$STREAM_BYTES" --json --interval 0 >"$tmp/tx.log"
    wait
    rx=$(summary "$tmp/rx.log")
    [ "$(field "$rx" total_bytes)" = "$(field "$(summary "$tmp/tx.log")" total_bytes)" ] ||
      { echo "compare_stream: bytes lost: $rx"; exit 1; }
    rows+="$t $(field "$rx" mb_per_s) $bench"$'\n'
  done
done

echo "$rows" | python3 -c '
import statistics, sys
tmp, window = sys.argv[1], sys.argv[2]
by = {}
for line in sys.stdin:
    if line.strip():
        t, stream, bench = line.split()
        by.setdefault(t, []).append((float(stream), float(bench)))
for t, runs in by.items():
    s = statistics.median(r[0] for r in runs)
    b = statistics.median(r[1] for r in runs)
    ratio = statistics.median(r[0] / r[1] for r in runs)
    print("stream 64 KiB frames (gen, %s, window %s) %.0f MB/s ... ratio %.2f vs ferry bench write 64 KiB x%s (%.0f MB/s)"
          % (t, window, s, ratio, window, b))
    open("%s/rate_%s" % (tmp, t), "w").write("%.0f" % s)
' "$tmp" "$WINDOW"

# The emulator at a share of the first transport's stream rate, through the stream.
first=${TRANSPORTS%% *}
rate=$(python3 -c 'import sys; print("%dMB/s" % (float(sys.argv[1]) * float(sys.argv[2])))' \
  "$(cat "$tmp/rate_$first")" "$EMULATE_SHARE")
"$FERRY" emulate --listen tcp:127.0.0.1:0 --rate "$rate" --frame 64K --duration "$EMULATE_SECONDS" \
  --json --interval 0 >"$tmp/em.log" 2>&1 &
for _ in $(seq 100); do grep -q '^listening on ' "$tmp/em.log" 2>/dev/null && break; sleep 0.05; done
source=$(sed -n 's/^listening on //p' "$tmp/em.log")
at=$(start_receiver "$first" "$tmp/rx.log" --verify)
"$FERRY" stream --connect "$at" --transport "$first" --source "$source" --json --interval 0 >"$tmp/tx.log"
wait
rx=$(summary "$tmp/rx.log")
em=$(summary "$tmp/em.log")
echo "emulator at $rate for ${EMULATE_SECONDS} s over $first: frames $(field "$rx" frames) of $(field "$em" frames) sent," \
  "lost $(field "$rx" lost), bad CRC $(field "$rx" bad_crc), late (>1 ms) $(field "$rx" late)," \
  "latency p50 $(field "$rx" latency_p50_us) us p99 $(field "$rx" latency_p99_us) us," \
  "emulator late $(field "$em" late)"

# Metrics on and off, alternated so that the host's slow and fast spells fall on both; each
# transport as it comes, and shm busy-polled too (no thread wake-ups: the smallest p50, where a
# cost shows most).
metric_cases=()
for t in $TRANSPORTS; do metric_cases+=("$t"); done
[[ " $TRANSPORTS " == *" shm "* ]] && metric_cases+=("shm --busy-poll-us 20")
for c in "${metric_cases[@]}"; do
  read -r -a args <<<"$c"
  for _ in $(seq 1 "$METRICS_PAIRS"); do
    for m in 1 0; do
      "$FERRY" bench --transport "${args[@]}" --op write --sizes 8 --iters 20000 --metrics "$m" --json |
        python3 -c 'import json,sys; print(sys.argv[1].replace(" ", "_"), sys.argv[2], json.loads(sys.stdin.readline())["p50_us"])' "$c" "$m"
    done
  done
done | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    c, m, p50 = line.split()
    runs.setdefault(c, {}).setdefault(m, []).append(float(p50))
for c, by in runs.items():
    on, off = statistics.median(by["1"]), statistics.median(by["0"])
    print("8-byte write p50 (%s), metrics on %.2f us, off %.2f us ... ratio on/off %.3f (%d runs each)"
          % (c.replace("_", " "), on, off, on / off, len(by["1"])))
'
