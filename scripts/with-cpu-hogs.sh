#!/usr/bin/env bash
# Runs a command with N CPU-bound processes beside it (make test-loaded), and stops them after.
# Usage: with-cpu-hogs.sh N command...
set -euo pipefail
n=$1
shift
hogs=()
for ((i = 0; i < n; i++)); do
  (while :; do :; done) &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
echo "with-cpu-hogs: ${n} busy processes running beside: $*"
"$@"
