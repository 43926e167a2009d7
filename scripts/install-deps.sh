#!/usr/bin/env bash
# Installs the Debian packages Ferry builds, tests and benchmarks with.
# Idempotent: only missing packages are fetched, so repeated `make` calls stay fast.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev          # libFuzzer target for the wire decoders
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libssl-dev           # CLI parsing; HMAC-SHA256 for the handshake
  iperf3 ucx-utils                  # peers measured side by side in bench/compare_tcp.sh
  libibverbs-dev ibverbs-providers  # verbs transport; rxe provider for the Soft-RoCE guest
  qemu-system-x86 busybox-static cpio xz-utils zstd   # tests/rdma: qemu guest + initramfs
  ibverbs-utils perftest iproute2   # tests/rdma: ibv_devinfo, ib_*_bw/lat, `rdma link`
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
