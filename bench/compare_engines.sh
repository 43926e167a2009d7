#!/usr/bin/env bash
# Ferry beside the engines its users choose between (NIXL, Mooncake Transfer Engine), on CPU
# memory, over TCP and between two processes of this host, in one interleaved run that prints
# the ratios (bench/engines/compare_engines.py says what runs and how each engine is driven).
#   bash bench/compare_engines.sh [--fast] [options of compare_engines.py]   (make bench-engines)
# --fast: one shape, one round (make test runs it so that the script and drivers do not rot).
#
# The peers come from PyPI into a virtual environment of their own (build/venv-peers), pinned,
# without their dependencies (nixl-cu12 asks for torch, 2.5 GB of CUDA wheels that CPU memory
# does not use). Mooncake's wheel links libcudart.so.12 (PyPI's nvidia-cuda-runtime-cu12) and
# libcuda.so.1: a driver stand-in is built here from the driver calls its libraries import,
# each answering CUDA_ERROR_NO_DEVICE, and given to the peers' processes only. A peer that
# cannot be installed is reported as skipped with pip's reason; Ferry's own figures come from
# the package in $VENV (make test-python or make bench-engines installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-build/venv}
PEERS=${PEERS:-build/venv-peers}
SYSTEM_PYTHON=${SYSTEM_PYTHON:-/usr/bin/python3}
NIXL_WHEELS="nixl-cu12==1.5.1 numpy"
MOONCAKE_WHEELS="mooncake-transfer-engine==0.3.13.post1 nvidia-cuda-runtime-cu12==12.9.79 numpy"

"$VENV/bin/python" -c "import ferry" 2>/dev/null ||
  { echo "compare_engines: no ferry package in $VENV (make test-python installs it)"; exit 1; }
test -x "$PEERS/bin/python" || "$SYSTEM_PYTHON" -m venv "$PEERS"

args=(--python "ferry=$VENV/bin/python")
# install ENGINE WHEELS...: pinned, once (a marker names what was installed).
install() {
  local engine=$1; shift
  local marker="$PEERS/.installed-$engine" log="$PEERS/pip-$engine.log"
  if [ "$(cat "$marker" 2>/dev/null)" != "$*" ]; then
    if ! "$PEERS/bin/python" -m pip install -q --no-deps "$@" >"$log" 2>&1; then
      args+=(--skip "$engine=pip install $* failed: $(grep -v '^\s*$' "$log" | tail -1)")
      return
    fi
    echo "$*" >"$marker"
  fi
  args+=(--python "$engine=$PEERS/bin/python")
}
install nixl $NIXL_WHEELS
install mooncake $MOONCAKE_WHEELS

site=$("$PEERS/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d "$site/mooncake" ] && [ ! -e "$PEERS/cuda-stand-in/libcuda.so.1" ]; then
  mkdir -p "$PEERS/cuda-stand-in"
  nm -D --undefined-only "$site"/mooncake/*.so "$site/mooncake/transfer_engine_bench" 2>/dev/null |
    awk '$2 ~ /^cu[A-Z]/ {print $2}' | sort -u |
    awk 'BEGIN {print "/* libcuda.so.1 stand-in for CPU memory: no device. */"}
         $1 == "cuGetErrorString" || $1 == "cuGetErrorName" {
           print "int " $1 "(int e, const char** s) { (void)e; *s = \"no CUDA device\"; return 0; }"; next }
         {print "int " $1 "(void) { return 100; /* CUDA_ERROR_NO_DEVICE */ }"}' \
      >"$PEERS/cuda-stand-in/libcuda.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$PEERS/cuda-stand-in/libcuda.so.1" \
    "$PEERS/cuda-stand-in/libcuda.c"
fi
args+=(--peer-library-path "$site/nvidia/cuda_runtime/lib:$PWD/$PEERS/cuda-stand-in")

exec python3 bench/engines/compare_engines.py "${args[@]}" "$@"
