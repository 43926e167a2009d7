#!/usr/bin/env bash
# Boots the Soft-RoCE guest (qemu, Debian's generic kernel, rdma_rxe) and runs a test list
# in it. See tests/rdma/README.md.
#
# usage: tests/rdma/run-guest.sh --tests FILE [--bin PATH]... [--file PATH]...
#                                [--timeout SECS] [--test-timeout SECS] [--out DIR]
#                                [--show-logs]
#
#   --tests FILE        one test per line: "<name> [timeout=SECS] <shell command>"
#                       ('#' comments and blank lines ignored). Commands run in the
#                       guest's busybox sh after rxe0 is up, with $GUEST_IP (10.99.0.1)
#                       and $RDMA_DEV (rxe0) set; two-sided tests use rdma-pair (README).
#   --bin PATH          an executable to run in the guest: copied with its ldd closure to
#                       the same absolute path, and linked as /opt/ferry/bin/<name> (on PATH).
#   --file PATH         any other file, copied to the same absolute path.
#   --timeout SECS      limit for the whole qemu run (default 300).
#   --test-timeout SECS default per-test limit inside the guest (default 120).
#   --out DIR           cache/output directory (default <repo>/build/rdma-guest).
#   --show-logs         print every test's whole guest log, not only failures' tails
#                       (slow: the serial console manages 30-50 lines/s).
#
# Prints the guest's RESULT/METRIC/TIME lines, keeps the whole serial log in
# DIR/last-run.log, and exits non-zero if the rxe setup failed, a test failed or printed
# no RESULT, the guest did not finish, or qemu ran past --timeout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/build/rdma-guest"
tests_file=""
bins=() files=()
timeout_s=300
test_timeout=120
show_logs=0

die() { echo "run-guest: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --tests) [ $# -ge 2 ] || die "--tests needs a file"; tests_file="$2"; shift 2 ;;
    --bin) [ $# -ge 2 ] || die "--bin needs a path"; bins+=("$2"); shift 2 ;;
    --file) [ $# -ge 2 ] || die "--file needs a path"; files+=("$2"); shift 2 ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; timeout_s="$2"; shift 2 ;;
    --test-timeout) [ $# -ge 2 ] || die "--test-timeout needs seconds"; test_timeout="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out="$2"; shift 2 ;;
    --show-logs) show_logs=1; shift ;;
    -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$tests_file" ] || die "--tests FILE is required (e.g. --tests tests/rdma/perftest.tests)"
[ -f "$tests_file" ] || die "tests file '$tests_file' not found"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds, got '$timeout_s'"
[[ "$test_timeout" =~ ^[0-9]+$ ]] || die "--test-timeout must be whole seconds, got '$test_timeout'"

# Expected test names, parsed like the guest's /init does.
names=()
while IFS= read -r line || [ -n "$line" ]; do
  line="${line#"${line%%[![:space:]]*}"}"
  case "$line" in ""|"#"*) continue ;; esac
  n="${line%%[[:space:]]*}"
  [[ "$n" =~ ^[A-Za-z0-9_.+-]+$ ]] || die "$tests_file: bad test name '$n' (letters, digits, _ . + - only)"
  [ "$n" != setup ] || die "$tests_file: the name 'setup' is reserved"
  for m in "${names[@]}"; do [ "$m" != "$n" ] || die "$tests_file: duplicate test name '$n'"; done
  rest="${line#"$n"}"; rest="${rest#"${rest%%[![:space:]]*}"}"
  [ -n "$rest" ] || die "$tests_file: test '$n' has no command"
  names+=("$n")
done < "$tests_file"
[ ${#names[@]} -gt 0 ] || die "$tests_file lists no tests"

start=$(date +%s.%N)
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d "$out/.run.XXXXXX")"
trap 'rm -rf "$work"' EXIT
pack=(--initrd "$work/initrd.img" --out "$out" --tests "$tests_file"
      --env "$(printf 'TEST_TIMEOUT=%s\nSHOW_LOGS=%s' "$test_timeout" "$show_logs")")
for b in "${bins[@]}"; do pack+=(--bin "$b"); done
for f in "${files[@]}"; do pack+=(--file "$f"); done
mapfile -t packed < <(bash "$here/pack-guest.sh" "${pack[@]}") || true
[ ${#packed[@]} -eq 2 ] && [ -s "${packed[1]}" ] || die "pack-guest.sh failed (see its messages above)"
vmlinuz="${packed[0]}"

# --- boot --------------------------------------------------------------------------
qemu="$(command -v qemu-system-x86_64)" || die "qemu-system-x86_64 not found (package qemu-system-x86)"
log="$out/last-run.log"
# The guest's two vCPU threads need both host cores: other load shows up directly in the
# figures (ib_write_lat jumps from ~40 usec to ~4000 usec, a host scheduler slice).
# Runnable processes other than the sampling awk, averaged over 0.5 s (the load average
# would still count a previous guest).
busy="$(for _ in 1 2 3 4 5; do awk '/^procs_running/ { print $2 - 1 }' /proc/stat; sleep 0.1; done \
        | awk '{ s += $1 } END { printf "%.1f", s / NR }')"
if awk -v b="$busy" 'BEGIN { exit !(b >= 0.5) }'; then
  echo "run-guest: warning: host busy (${busy} other runnable processes on $(nproc) cores); guest timings will be unreliable"
fi
echo "run-guest: booting $(basename "$(readlink -f "$vmlinuz")") under TCG, tests: ${names[*]}"
# A guest now and then hangs in early boot under TCG (seen once in hundreds of boots: SeaBIOS,
# then silence). A watchdog stops a guest that has not set up rxe0 after $boot_limit s (a
# normal boot takes 10-20 s) and the run boots once more.
boot_limit=300
boot() {
  rm -f "$work/qemu.pid"
  (
    for _ in $(seq "$boot_limit"); do
      sleep 1
      grep -q '^RESULT setup' "$log" 2>/dev/null && exit 0
    done
    echo "run-guest: no guest setup after ${boot_limit}s: stopping this guest" >&2
    [ -f "$work/qemu.pid" ] && kill "$(cat "$work/qemu.pid")" 2>/dev/null
  ) &
  local watchdog=$!
  set +e
  # TCG, multi-threaded: with one vCPU thread a busy-polling peer costs a 4 ms tick per
  # round trip. (KVM: /dev/kvm exists on our machines but nested guests hang there.)
  # clocksource=tsc: TCG's emulated HPET, the default, makes every clock_gettime a trap costing
  # tens of microseconds; perftest times with rdtsc, so Ferry must read time as cheaply.
  # 2 GiB: the initramfs is held twice while it unpacks (the image, then its files), and the
  # sanitized suite's four binaries alone are ~340 MiB; with 1 GiB unpacking them failed ("write
  # error") and every test was missing its binary. The host only backs what the guest touches.
  timeout -k 10 "$timeout_s" "$qemu" -machine pc -accel tcg,thread=multi -cpu max -smp 2 -m 2048M \
      -nographic -no-reboot -serial mon:stdio -nic none -pidfile "$work/qemu.pid" \
      -kernel "$vmlinuz" -initrd "$work/initrd.img" \
      -append "console=ttyS0 panic=-1 quiet clocksource=tsc tsc=reliable" < /dev/null 2>&1 \
    | sed -u 's/\r$//' | tee "$log" \
    | grep --line-buffered -E '^(RESULT|METRIC|TIME|TIMEOUT|NOTE|RDMA-GUEST|  \| )|Kernel panic'
  qemu_rc=${PIPESTATUS[0]}
  set -e
  kill "$watchdog" 2>/dev/null || true
  wait "$watchdog" 2>/dev/null || true
}
for attempt in 1 2; do
  boot
  grep -q '^RESULT setup' "$log" && break
  [ "$attempt" = 1 ] && echo "run-guest: the guest did not boot; booting it again"
done
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

# --- verdict -----------------------------------------------------------------------
failures=()
if [ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ]; then
  failures+=("qemu ran past --timeout ${timeout_s}s")
elif [ "$qemu_rc" -ne 0 ]; then
  failures+=("qemu exited with status $qemu_rc")
fi
result_of() { awk -v n="$1" '$1 == "RESULT" && $2 == n { sub(/^rc=/, "", $3); r = $3 } END { print r }' "$log"; }
rc="$(result_of setup)"
if [ -z "$rc" ]; then
  failures+=("guest printed no 'RESULT setup' (boot failed? see $log)")
elif [ "$rc" != 0 ]; then
  failures+=("rxe setup failed in the guest (rc=$rc)")
fi
passed=0
if [ "$rc" = 0 ]; then
  for n in "${names[@]}"; do
    r="$(result_of "$n")"
    if [ -z "$r" ]; then failures+=("$n: no RESULT")
    elif [ "$r" != 0 ]; then failures+=("$n: rc=$r")
    else passed=$((passed + 1)); fi
  done
fi
grep -q '^RDMA-GUEST DONE' "$log" || failures+=("the guest did not finish its test list")

if [ ${#failures[@]} -eq 0 ]; then
  echo "run-guest: PASS ${passed}/${#names[@]} tests in ${elapsed}s (log: $log)"
  exit 0
fi
echo "run-guest: FAIL ${passed}/${#names[@]} tests passed in ${elapsed}s (log: $log)" >&2
for f in "${failures[@]}"; do echo "run-guest:   $f" >&2; done
exit 1
