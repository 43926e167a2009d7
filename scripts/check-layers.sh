#!/usr/bin/env bash
# Enforces the layer rules of docs/architecture.md: a layer includes only itself, the layers
# below it and the vocabulary headers ferry/error.hpp, ferry/types.hpp, ferry/config.hpp, ferry/log.hpp and
# ferry/metrics.hpp.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
check() {  # check DIR ALLOWED_REGEX
  local dir=$1 allowed=$2
  while IFS= read -r line; do
    echo "layer violation: $line"
    fail=1
  done < <(grep -rnE '#include "[^"]+"' "$dir" --include='*.cpp' --include='*.hpp' |
           grep -vE "#include \"($allowed)" || true)
}

vocab='ferry/error\.hpp|ferry/log\.hpp|ferry/types\.hpp|ferry/config\.hpp|ferry/export\.hpp|ferry/metrics\.hpp'
check src/core      "core/|$vocab"
check src/transport "core/|transport/|$vocab"
check src/engine    "core/|transport/[a-z_]+\.hpp|engine/|ferry/"
check tools         "ferry/|[a-z_]+\.hpp"
check include/ferry "ferry/"
check examples      "ferry/|two_process\.hpp"
check python/src    "ferry/|bindings\.hpp"
# A transport's private headers never leave its folder: the engine reaches it through
# transport/contract.hpp and transport/registry.hpp alone.
for t in src/transport/*/; do
  name=$(basename "$t")
  other=$(grep -rnE '#include "transport/[a-z_]+/' src --include='*.cpp' --include='*.hpp' |
          grep -v "^src/transport/$name/" | grep "transport/$name/" || true)
  if [ -n "$other" ]; then echo "layer violation (private to $name): $other"; fail=1; fi
done
[ $fail -eq 0 ] && echo "layers: ok"
exit $fail
