#!/usr/bin/env bash
# The GPU paths beside their parts, one run (docs/gpu.md): the staged pipeline
# (bench/staging_pipeline) over shm and over TCP, each against its stages measured alone.
#   bash bench/compare_gpu.sh              (after `make build`)
# With the real driver where `ferry info` lists a GPU; else against the CUDA stand-in
# (tests/support/cuda_standin), whose "device" copies are host memcpy: there the ratios show
# the pipeline's overlap, not a GPU's speeds. STANDIN=1 forces the stand-in.
set -euo pipefail
cd "$(dirname "$0")/.."
FERRY=${FERRY:-build/release/tools/ferry}
PIPELINE=${PIPELINE:-build/release/bench/staging_pipeline}
MIB=${MIB:-64}
ROUNDS=${ROUNDS:-5}
[ -x "$FERRY" ] && [ -x "$PIPELINE" ] || { echo "compare_gpu: run 'make build' first"; exit 1; }

if [ "${STANDIN:-0}" = 1 ] || ! "$FERRY" info | grep -q '^gpus (CUDA driver'; then
  cmake --build --preset release --target ferry_cuda_standin >/dev/null
  export LD_LIBRARY_PATH=$PWD/build/release/tests/cuda-standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "compare_gpu: against the CUDA stand-in (no GPU driver used)"
fi
"$FERRY" info | grep -A3 '^gpus (CUDA driver' || true
for transport in shm tcp; do
  "$PIPELINE" "$transport" "$MIB" "$ROUNDS"
done
