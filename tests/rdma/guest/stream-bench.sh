#!/bin/sh
# ferry stream beside ferry bench over verbs in the Soft-RoCE guest (tests/rdma/stream-bench.tests):
#   stream-bench.sh bench N     ferry bench write 64 KiB, 16 in flight      -> METRIC ferry_write_bw_64k_w16_rN
#   stream-bench.sh stream N    ferry stream, 64 KiB frames, window 16      -> METRIC ferry_stream_64k_w16_rN
#   stream-bench.sh emulate S   ferry emulate at 0.15x the last stream's rate for S seconds through a
#                               verifying stream                            -> METRIC emulate_* lines
# The guest has sh, sed and awk, no python: JSON fields are picked with sed.
set -eu
field() {  # FILE KEY: KEY of the file's summary line
  sed -n "s/.*\"kind\":\"summary\".*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" "$1" | tail -1
}
listening() {  # FILE: the address it printed once listening
  for _ in $(seq 200); do
    grep -q '^listening on ' "$1" 2>/dev/null && break
    sleep 0.1
  done
  sed -n 's/^listening on //p' "$1"
}
receiver() {  # OUT extra-args...: a receiver in the background; prints its address
  out=$1
  shift
  ferry stream --listen 127.0.0.1:0 --transport verbs --slots 64 --slot-bytes 65552 --json \
    --interval 0 "$@" >"$out" 2>&1 &
  listening "$out"
}
case $1 in
bench)
  ferry bench --transport verbs --op write --sizes 64K --concurrency 16 --iters 2000 --json >/tmp/b.json
  cat /tmp/b.json
  sed -n "s/.*\"mb_per_s\":\([0-9.]*\).*/METRIC ferry_write_bw_64k_w16_r$2 \1 MB1e6\/sec/p" /tmp/b.json
  ;;
stream)
  at=$(receiver /tmp/rx.log)
  ferry stream --connect "$at" --transport verbs --window 16 --source gen --frame 64K \
    --bytes 256M --json --interval 0 >/tmp/tx.log
  wait
  cat /tmp/tx.log /tmp/rx.log
  [ "$(field /tmp/rx.log total_bytes)" = "$(field /tmp/tx.log total_bytes)" ]
  cp /tmp/rx.log /tmp/stream-last.log
  echo "METRIC ferry_stream_64k_w16_r$2 $(field /tmp/rx.log mb_per_s) MB1e6/sec"
  ;;
emulate)
  rate=$(field /tmp/stream-last.log mb_per_s | awk '{printf "%d", $1 * 0.15}')
  ferry emulate --listen tcp:127.0.0.1:0 --rate "${rate}MB/s" --frame 64K --duration "$2" \
    --json --interval 0 >/tmp/em.log 2>&1 &
  source=$(listening /tmp/em.log)
  at=$(receiver /tmp/rx.log --verify)
  ferry stream --connect "$at" --transport verbs --source "$source" --json --interval 0 >/tmp/tx.log
  wait
  cat /tmp/em.log /tmp/rx.log
  echo "METRIC emulate_rate_MBps $rate MBps"
  for k in frames lost bad_crc late latency_p50_us latency_p99_us; do
    echo "METRIC emulate_$k $(field /tmp/rx.log $k) value"
  done
  echo "METRIC emulate_frames_sent $(field /tmp/em.log frames) value"
  [ "$(field /tmp/rx.log lost)" = 0 ] && [ "$(field /tmp/rx.log bad_crc)" = 0 ]
  ;;
esac
