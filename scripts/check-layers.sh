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
# No circles between engine files: the listener reaches its engine through ListenerHost
# (listener.hpp), and routing, the handshake's codecs and a peer's channel set know no engine.
# engine_impl.hpp includes them, never the other way round.
circles=$(grep -lE '#include "engine/engine_impl.hpp"' src/engine/listener.* src/engine/route.* \
            src/engine/handshake.* src/engine/channel_set.hpp 2>/dev/null || true)
if [ -n "$circles" ]; then
  echo "layer violation (circle through engine_impl.hpp): $circles"
  fail=1
fi
[ $fail -eq 0 ] && echo "layers: ok"
exit $fail
