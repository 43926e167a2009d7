#!/usr/bin/env bash
# Discovery's lookup latency beside a direct connect (make bench-lookup): starts an etcd of its
# own (Debian's etcd-server) on free loopback ports and a scratch data directory, runs
# build/release/bench/lookup_latency against it, and stops it.
#   bench/compare_lookup.sh [ITERS]   (default 200)
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-200}
bin=build/release/bench/lookup_latency
[ -x "$bin" ] || { echo "compare_lookup: $bin is missing (make build)" >&2; exit 1; }
command -v etcd >/dev/null || { echo "compare_lookup: etcd is missing (scripts/install-deps.sh test)" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d /tmp/ferry-lookup-XXXXXX)
client="http://127.0.0.1:$(free_port)"
peer="http://127.0.0.1:$(free_port)"
etcd --name=bench --data-dir="$dir/data" --listen-client-urls="$client" \
     --advertise-client-urls="$client" --listen-peer-urls="$peer" \
     --initial-advertise-peer-urls="$peer" --initial-cluster="bench=$peer" \
     --logger=zap --log-outputs="$dir/etcd.log" --log-level=warn &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$dir"' EXIT
healthy() { python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1] + '/health', timeout=1)" "$client" 2>/dev/null; }
for _ in $(seq 600); do healthy && break; sleep 0.1; done
healthy || { echo "compare_lookup: etcd did not start ($dir/etcd.log)" >&2; exit 1; }
echo "etcd $(etcd --version | head -1 | awk '{print $3}') at $client"
"$bin" "$client" "$iters"
