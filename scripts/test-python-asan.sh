#!/usr/bin/env bash
# The Python suite against an ASan+UBSan build of the extension (make test-python-asan): the
# binding's lifetimes, buffers and callbacks under the sanitizers, torch included.
# Python itself is not instrumented, so the runtimes are preloaded (they must come first),
# for the build too: nanobind's stub generator imports the module. Python's own allocations
# live until exit by design, so leak detection is off; any other report fails the run.
# What the suite requires (torch, the CUDA stand-in) comes from the caller's environment
# (make test-python-asan).
set -euo pipefail
venv=${VENV_ASAN:-build/venv-asan}
python=${SYSTEM_PYTHON:-/usr/bin/python3}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

test -x "$venv/bin/python" || "$python" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q ".[test]" \
  --config-settings=build-dir=build/python-asan \
  --config-settings=cmake.build-type=RelWithDebInfo \
  "--config-settings=cmake.define.CMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "--config-settings=cmake.define.CMAKE_CXX_FLAGS=$flags" \
  "--config-settings=cmake.define.CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined"
cd python/tests
"../../$venv/bin/python" -m pytest -q -p no:cacheprovider .
