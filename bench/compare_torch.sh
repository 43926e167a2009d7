#!/usr/bin/env bash
# The torch.distributed backend beside Ferry's own C++ batch write and gloo (make bench-torch):
# batch_isend_irecv of 64 x 1 MiB CPU tensors between two torchrun ranks over "ferry" and over
# gloo (bench/torch_batch.py), and `ferry bench --op write --batch 64 --sizes 1M` on the same
# transport, in one run; prints GB/s and the ratios. Needs the package installed in build/venv.
#   bench/compare_torch.sh [TRANSPORT...]   (default: tcp shm)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${VENV:-build/venv}/bin/python
ferry=build/release/tools/ferry
transports=("${@:-tcp}")
[ $# -eq 0 ] && transports=(tcp shm)
for t in "${transports[@]}"; do
  cxx=$("$ferry" bench --op write --sizes 1M --batch 64 --transport "$t" --iters 200 --json |
        "$python" -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["mb_per_s"] / 1e3)')
  # torch 1.13's torchrun on Python 3.11 cannot parse --redirects 0 (its default): 2 (stderr)
  # is one it can, and --tee 2 still shows it.
  out=$(FERRY_TRANSPORTS=$t "$python" -m torch.distributed.run --standalone --nproc_per_node=2 \
          --redirects=2 --tee=2 bench/torch_batch.py 2>/dev/null)
  "$python" - "$t" "$cxx" "$out" <<'PY'
import json, sys
transport, cxx, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = {}
for line in out.splitlines():
    line = line[line.find("{"):]
    if line.startswith("{"):
        r = json.loads(line)
        rows[r["backend"]] = r["gbps"]
print(f"{transport}: 64 x 1 MiB  ferry C++ batch write {cxx:.2f} GB/s  "
      f"torch 'ferry' {rows['ferry']:.2f} GB/s  gloo {rows['gloo']:.2f} GB/s")
print(f"{transport}:   torch 'ferry' / C++ batch write {rows['ferry'] / cxx:.2f}   "
      f"'ferry' / gloo {rows['ferry'] / rows['gloo']:.2f}")
PY
done
