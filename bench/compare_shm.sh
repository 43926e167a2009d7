#!/usr/bin/env bash
# Ferry between two processes of this host (the shm transport) side by side with memcpy, one
# process_vm_readv stream (bench/shm_baselines) and UCX's shared-memory paths, all in one run,
# printing ratios. Absolute numbers on shared 2-core machines are noisy; the ratios measured
# together are what docs/performance.md records. Two process_vm_readv streams against one show
# what splitting a pull over threads can reach on this host at most (the cma rows' ceiling).
#   bash bench/compare_shm.sh            (after `make build`)
set -euo pipefail
cd "$(dirname "$0")/.."
FERRY=${FERRY:-build/release/tools/ferry}
BASELINES=${BASELINES:-build/release/bench/shm_baselines}
# Preloaded into ucx_perftest so that its buffers hold bytes (see bench/ucx_populate.cpp).
POPULATE=${POPULATE:-build/release/bench/libucx_populate.so}
PORT=${PORT:-15211}
REPEAT=${REPEAT:-3}
# Bytes each side of a window comparison (Ferry's 8 in flight, UCX's bandwidth tests) moves per
# size: at 30 GB/s the bench's default 512 MiB lasts 17 ms, which one scheduling hiccup decides
# (1 MiB sends moved 8-39 GB/s from run to run so).
WINDOW_BYTES=${WINDOW_BYTES:-8589934592}
# ferry bench takes 1 to 20000 iterations: 16 MiB x 1 up to 1 MiB x 20000.
(( WINDOW_BYTES >= 16777216 && WINDOW_BYTES <= 20000 * 1048576 )) ||
  { echo "compare_shm: WINDOW_BYTES must be 16 MiB to 20000 MiB"; exit 1; }

for tool in ucx_perftest python3; do
  command -v "$tool" >/dev/null || { echo "compare_shm: $tool missing (make deps installs it)"; exit 1; }
done
[ -x "$FERRY" ] && [ -x "$BASELINES" ] && [ -f "$POPULATE" ] ||
  { echo "compare_shm: run 'make build' first"; exit 1; }

cleanup() { kill $(jobs -p) 2>/dev/null || true; }
trap cleanup EXIT

# UCX bandwidth in MB/s: UCX_TLS, test, size, then "written" for buffers that hold bytes (as
# Ferry's do) or "as-is" for ucx_perftest's own, whose send buffer is never written.
ucx_bw() {
  local with=(env UCX_TLS="$1")
  [ "$4" = written ] && with+=(UCX_ALLOC_PRIO=heap LD_PRELOAD="$(realpath "$POPULATE")")
  "${with[@]}" ucx_perftest -p "$PORT" >/dev/null 2>&1 &
  sleep 0.5
  "${with[@]}" ucx_perftest 127.0.0.1 -p "$PORT" -t "$2" -s "$3" -n $((WINDOW_BYTES / $3 + 20)) \
    -w 20 2>/dev/null | awk '/Final:/ {print $(NF-2)}' | tail -1
  wait
}
# One field of ferry bench's JSON lines: json-lines op size field.
pick() {
  echo "$1" | python3 -c "
import json,sys
for line in filter(str.strip, sys.stdin):
    r = json.loads(line)
    if r.get('op') == '$2' and r.get('size') == $3 and 'mb_per_s' in r: print(r['$4'])"
}

M1=1048576 M16=16777216 M64=67108864
rows=""
for run in $(seq 1 "$REPEAT"); do
  base=$("$BASELINES" $M1 $M16 $M64)
  b() { echo "$base" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
  # Mapped (memory from Engine::allocate): one op at a time, as memcpy runs.
  mapped=$("$FERRY" bench --transport shm --memory allocate --op write,read --sizes $M1,$M64 --json)
  # Any registered memory (process_vm_readv): one op at a time at 64 MiB.
  cma=$("$FERRY" bench --transport shm --op write,read --sizes $M64 --json)
  # Against UCX's bandwidth tests, which keep a window of messages in flight from one buffer
  # into one buffer: 8 in flight, all on the first area (--same-area). Registered memory's
  # writes of 1 and 16 MiB ride in the rings (ShmConfig::ring_copies_up_to); 16 MiB messages are
  # pulled with process_vm_readv.
  win_map="" win_cma=""
  for s in $M1 $M16; do
    window=(--sizes $s --concurrency 8 --same-area --iters $((WINDOW_BYTES / s)) --json)
    win_map+=$("$FERRY" bench --transport shm --memory allocate --op write "${window[@]}")$'\n'
    win_cma+=$("$FERRY" bench --transport shm --op write,send "${window[@]}")$'\n'
  done
  lat=$("$FERRY" bench --transport shm --memory allocate --op write,pingpong --sizes 8 --json)
  # Registered memory, small: records through the rings, the target's progress thread asleep
  # between operations (the default) or busy-polling them for 20 us after work.
  lat_reg=$("$FERRY" bench --transport shm --op write,write_imm,imm_pingpong --sizes 8 --json)
  lat_busy=$("$FERRY" bench --transport shm --op write,write_imm --sizes 8 --busy-poll-us 20 \
    --json)
  # Without cross-memory attach (as where the kernel refuses it): 32 KiB pieces through the
  # rings, beside TCP loopback.
  ring=$("$FERRY" bench --shm.cross_memory false --op write,read --sizes $M1 --concurrency 8 --same-area \
    --json)
  tcp=$("$FERRY" bench --transport tcp --op write,read --sizes $M1 --concurrency 8 --same-area \
    --json)
  ucx="" ucx_as_is=""
  for buffers in written as-is; do
    for s in $M1 $M16; do
      best=0
      for tls in posix cma,tcp; do
        for t in tag_bw ucp_am_bw; do
          v=$(ucx_bw "$tls" "$t" "$s" "$buffers"); v=${v:-0}
          best=$(python3 -c "print(max($best, $v))")
        done
      done
      if [ "$buffers" = written ]; then ucx+=" $best"; else ucx_as_is+=" $best"; fi
    done
  done
  rows+="$run $(b memcpy_${M1}_mbs) $(b memcpy_${M64}_mbs) $(b cma_${M64}_mbs)"
  rows+=" $(pick "$mapped" write $M1 mb_per_s) $(pick "$mapped" read $M1 mb_per_s)"
  rows+=" $(pick "$mapped" write $M64 mb_per_s) $(pick "$mapped" read $M64 mb_per_s)"
  rows+=" $(pick "$cma" write $M64 mb_per_s) $(pick "$cma" read $M64 mb_per_s)"
  for s in $M1 $M16; do
    rows+=" $(pick "$win_map" write $s mb_per_s) $(pick "$win_cma" write $s mb_per_s)"
    rows+=" $(pick "$win_cma" send $s mb_per_s)"
  done
  rows+="$ucx $(pick "$lat" write 8 p50_us) $(pick "$lat" pingpong 8 p50_us)"
  rows+=" $(pick "$lat_reg" write 8 p50_us) $(pick "$lat_reg" write_imm 8 p50_us)"
  rows+=" $(pick "$lat_busy" write 8 p50_us) $(pick "$lat_busy" write_imm 8 p50_us)"
  rows+=" $(pick "$ring" write $M1 mb_per_s) $(pick "$ring" read $M1 mb_per_s)"
  rows+=" $(pick "$tcp" write $M1 mb_per_s) $(pick "$tcp" read $M1 mb_per_s)$ucx_as_is"
  rows+=" $(pick "$lat_reg" imm_pingpong 8 p50_us) $(b cma2_${M64}_mbs)"$'\n'
done

echo "$rows" | python3 -c '
import statistics, sys
runs = [list(map(float, l.split()[1:])) for l in sys.stdin if l.strip()]
(MC1, MC64, CMA64, MW1, MR1, MW64, MR64, CW64, CR64,
 XMW1, XCW1, XS1, XMW16, XCW16, XS16, U1, U16, LATW, LATPP,
 RW8, RI8, BW8, BI8, RINGW, RINGR, TCPW, TCPR, UA1, UA16, IPP8, CMA2_64) = range(31)
def med(i): return statistics.median(r[i] for r in runs)
def ratio(a, b): return statistics.median(r[a] / r[b] for r in runs if r[b] > 0)
rows = [
    ("mapped write 1 MiB vs memcpy 1 MiB", MW1, MC1),
    ("mapped read 1 MiB vs memcpy 1 MiB", MR1, MC1),
    ("mapped write 64 MiB vs memcpy 64 MiB", MW64, MC64),
    ("mapped read 64 MiB vs memcpy 64 MiB", MR64, MC64),
    ("cma write 64 MiB vs one process_vm_readv", CW64, CMA64),
    ("cma read 64 MiB vs one process_vm_readv", CR64, CMA64),
    ("two process_vm_readv streams vs one, 64 MiB", CMA2_64, CMA64),
    ("mapped write 1 MiB x8 vs UCX best", XMW1, U1),
    ("registered write 1 MiB x8 vs UCX best", XCW1, U1),
    ("send 1 MiB x8 vs UCX best", XS1, U1),
    ("mapped write 16 MiB x8 vs UCX best", XMW16, U16),
    ("registered write 16 MiB x8 vs UCX best", XCW16, U16),
    ("send 16 MiB x8 vs UCX best", XS16, U16),
    ("no cross-memory write 1 MiB x8 vs TCP", RINGW, TCPW),
    ("no cross-memory read 1 MiB x8 vs TCP", RINGR, TCPR),
]
print(f"medians of {len(runs)} runs (MB/s); ratio = median of per-run ratios")
print("%-44s %10s %10s %7s" % ("measurement", "ferry", "peer", "ratio"))
for name, a, b in rows:
    print(f"{name:<44} {med(a):>10.1f} {med(b):>10.1f} {ratio(a, b):>7.2f}")
print("UCX best = the higher of tag_bw and ucp_am_bw with UCX_TLS=posix and UCX_TLS=cma,tcp, its")
print("  buffers written (bench/ucx_populate.cpp); as ucx_perftest reports it, reading a send buffer")
print(f"  it never wrote: {med(UA1):.1f} MB/s at 1 MiB, {med(UA16):.1f} MB/s at 16 MiB")
print(f"mapped write 8 B p50 {med(LATW):.2f} us; write ping-pong 8 B p50 (half round trip) {med(LATPP):.2f} us")
print(f"registered 8 B p50: write {med(RW8):.2f} us, write_with_imm {med(RI8):.2f} us; "
      f"with --busy-poll-us 20: {med(BW8):.2f} us, {med(BI8):.2f} us (each a round trip: "
      "the notification was delivered before its answer left)")
print(f"write_with_imm notification 8 B p50 {med(IPP8):.2f} us (imm_pingpong: half the round trip "
      "of notifications answered, each side taking them from next_imm)")
'
