#!/usr/bin/env bash
# Ferry as someone else's project meets it: installs the release build into a scratch prefix,
# checks the layout, then builds and runs a small consumer four ways (find_package, pkg-config,
# add_subdirectory, FetchContent) and every ```cpp block of the README.
# Usage: tests/package/run.sh BUILD_DIR   (a configured and built tree, e.g. build/release)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/ferry-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
consumer=$root/tests/package/consumer
jobs=$(nproc)
step() { echo "== package: $*"; }
fail() { echo "package test FAILED: $*" >&2; exit 1; }

step "install into a scratch prefix"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
version=$(sed -n 's/^project(ferry VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
soversion=${version%.*}
for f in include/ferry/ferry.hpp include/ferry/error.hpp include/ferry/types.hpp \
         include/ferry/export.hpp lib/libferry.a "lib/libferry.so.$version" \
         "lib/libferry.so.$soversion" lib/libferry.so lib/cmake/ferry/ferryConfig.cmake \
         lib/cmake/ferry/ferryConfigVersion.cmake lib/cmake/ferry/ferryTargets.cmake \
         lib/pkgconfig/ferry.pc bin/ferry share/doc/ferry/LICENSE share/doc/ferry/NOTICE; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done
# Read whole before grep: under pipefail, `grep -q` quitting at its match could leave the
# writer a SIGPIPE and fail the pipeline (it did once, on a loaded machine).
dynamic=$(readelf -d "$prefix/lib/libferry.so")
grep -q "SONAME.*\[libferry.so.$soversion\]" <<<"$dynamic" ||
  fail "SONAME is not libferry.so.$soversion"
# Only the public API is exported: no engine, transport or core internals.
leaked=$(nm -D --defined-only -C "$prefix/lib/libferry.so" | cut -d' ' -f3- |
         grep -E '^((vtable|typeinfo|typeinfo name) for )?ferry::(detail|core|transport|engine)::' ||
         true)
[ -z "$leaked" ] || fail "libferry.so exports internals: $(echo "$leaked" | head -3)"
[ -z "$(ls "$prefix/include/ferry" | grep -v '\.hpp$')" ] || fail "non-headers in include/ferry"

step "find_package(ferry): ferry::ferry (shared) and ferry::ferry_static"
cmake -S "$consumer" -B "$work/find_package" -G Ninja -DFERRY_CONSUME=find_package \
      -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/find_package" -j "$jobs" >/dev/null
libs=$(ldd "$work/find_package/consumer")
grep -q "libferry.so.$soversion => $prefix/lib" <<<"$libs" ||
  fail "consumer does not load the installed libferry.so"
libs=$(ldd "$work/find_package/consumer_static")
if grep -q libferry <<<"$libs"; then
  fail "consumer_static loads libferry.so"
fi
"$work/find_package/consumer"
"$work/find_package/consumer_static"

step "pkg-config, from a relocated prefix"
mv "$prefix" "$work/moved"
prefix=$work/moved
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion ferry)" = "$version" ] || fail "pkg-config --modversion"
# shellcheck disable=SC2046  # word splitting of the flags is intended
c++ "$consumer/main.cpp" -o "$work/pkgconfig_consumer" $(pkg-config --cflags --libs ferry) \
    -Wl,-rpath,"$(pkg-config --variable=libdir ferry)"
"$work/pkgconfig_consumer"

step "README: every cpp block compiles and runs"
awk -v dir="$work/readme" 'BEGIN { n = 0 }
  /^```cpp$/ { n++; file = sprintf("%s/block%d.cpp", dir, n); inblock = 1; next }
  /^```$/ && inblock { inblock = 0; close(file); next }
  inblock { print > file }' < <(mkdir -p "$work/readme"; cat "$root/README.md")
blocks=$(ls "$work/readme"/*.cpp 2>/dev/null | wc -l)
[ "$blocks" -ge 1 ] || fail "no cpp block found in README.md"
for src in "$work/readme"/*.cpp; do
  # shellcheck disable=SC2046
  c++ -Wall -Wextra -Werror "$src" -o "${src%.cpp}" $(pkg-config --cflags --libs ferry) \
      -Wl,-rpath,"$(pkg-config --variable=libdir ferry)" || fail "README block $(basename "$src")"
  (cd "$work/readme" && timeout 120 "${src%.cpp}") || fail "README block $(basename "$src") ran"
done
echo "README blocks: $blocks compiled and ran"

step "add_subdirectory: the library alone, without the tools' and tests' dependencies"
cmake -S "$consumer" -B "$work/subdirectory" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFERRY_CONSUME=subdirectory -DFERRY_SOURCE_DIR="$root" >/dev/null
if grep -qE '^(CLI11_DIR|GTest_DIR)' "$work/subdirectory/CMakeCache.txt"; then
  fail "embedding Ferry looked for CLI11 or GoogleTest"
fi
cmake --build "$work/subdirectory" -j "$jobs" --target consumer >/dev/null
"$work/subdirectory/consumer"

step "FetchContent from an archive of this tree"
(cd "$root" && git ls-files -co --exclude-standard -z |
   tar --null -czf "$work/ferry-src.tar.gz" --transform 's,^,ferry/,' -T -)
sha=$(sha256sum "$work/ferry-src.tar.gz" | cut -d' ' -f1)
cmake -S "$consumer" -B "$work/fetchcontent" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFERRY_CONSUME=fetchcontent -DFERRY_URL="file://$work/ferry-src.tar.gz" \
      -DFERRY_URL_SHA256="$sha" >/dev/null
cmake --build "$work/fetchcontent" -j "$jobs" --target consumer >/dev/null
"$work/fetchcontent/consumer"

echo "package: 4 ways to consume Ferry passed (find_package, pkg-config, add_subdirectory, FetchContent)"
