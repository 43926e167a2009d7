#!/usr/bin/env bash
# Installs the Debian packages that one purpose needs, and nothing more:
#   build   the library alone          tools   + the ferry command
#   test    everything make test runs  bench   + the peers of bench/compare_*.sh
#   guest   the Soft-RoCE qemu guest (tests/rdma)
#   python  building the Python package (pip install .)
# Usage: scripts/install-deps.sh [PURPOSE...]   (default: build)
# Idempotent: only missing packages are fetched, so repeated `make` calls stay fast.
set -euo pipefail

build=(build-essential cmake ninja-build pkg-config
       libssl-dev                       # HMAC-SHA256 for the handshake
       nlohmann-json3-dev               # etcd's JSON (discovery), header-only
       libibverbs-dev)                  # verbs headers (libibverbs itself is loaded at run time)
tools=(libcli11-dev
       libcpp-httplib-dev)              # the live gauge's HTTP server
guest=(qemu-system-x86 busybox-static cpio xz-utils zstd   # qemu guest + initramfs
       ibverbs-providers ibverbs-utils perftest iproute2)  # rxe provider, ibv_devinfo, perftest
test=(libgtest-dev libgmock-dev
      clang libclang-rt-14-dev clang-tidy  # libFuzzer target, clang-tidy
      binutils                                             # readelf/nm for the package test
      etcd-server)                                         # discovery's tests run a real etcd
# The live gauge's page in a real browser (tests/browser, driven by Selenium from PyPI).
browser=(chromium chromium-driver)
bench=(iperf3 ucx-utils)
python=(python3 python3-dev python3-venv python3-pip)
# The Python suite's tensors: Debian's CPU build of torch (with its numpy and gloo for
# torch.distributed). PyPI's Linux wheels bring the CUDA libraries, gigabytes more.
torch=(python3-torch)

packages=()
for purpose in "${@:-build}"; do
  case $purpose in
    build) packages+=("${build[@]}") ;;
    tools) packages+=("${build[@]}" "${tools[@]}") ;;
    guest) packages+=("${guest[@]}") ;;
    python) packages+=("${build[@]}" "${python[@]}") ;;
    test) packages+=("${build[@]}" "${tools[@]}" "${test[@]}" "${guest[@]}" "${python[@]}" "${torch[@]}" "${browser[@]}") ;;
    bench) packages+=("${build[@]}" "${tools[@]}" "${bench[@]}") ;;
    *) echo "install-deps: unknown purpose '$purpose' (build, tools, test, bench, guest, python)" >&2
       exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
readarray -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

install_line="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "install-deps: these packages are missing and installing them needs root:" >&2
  echo "  apt-get update && $install_line" >&2
  echo "Ask an administrator to run that line (or run it with sudo), then try again." >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
