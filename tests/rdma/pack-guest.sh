#!/usr/bin/env bash
# Builds (or reuses) the base guest with build-guest.sh and appends a per-run overlay: project
# binaries with their ldd closure, other files, and optionally a tests file with its run
# settings. Used by run-guest.sh (one guest) and two-guest.py (two guests). See README.md.
#
# usage: tests/rdma/pack-guest.sh --initrd PATH [--tests FILE] [--env TEXT] [--bin PATH]...
#                                 [--file PATH]... [--out DIR]
#
#   --initrd PATH  where to write the initramfs (base + overlay)
#   --tests FILE   the guest's test list (/etc/rdma-guest/tests)
#   --env TEXT     the guest's run settings (/etc/rdma-guest/run.env), e.g. "TEST_TIMEOUT=120"
#   --bin PATH     an executable: copied with its ldd closure to the same absolute path, and
#                  linked as /opt/ferry/bin/<name> (on the guest's PATH)
#   --file PATH    any other file, copied to the same absolute path
#   --out DIR      build-guest.sh's cache directory (default <repo>/build/rdma-guest)
#
# Prints the kernel's path, then the initramfs's.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/build/rdma-guest"
initrd="" tests_file="" env_text=""
bins=() files=()

die() { echo "pack-guest: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --initrd) [ $# -ge 2 ] || die "--initrd needs a path"; initrd="$2"; shift 2 ;;
    --tests) [ $# -ge 2 ] || die "--tests needs a file"; tests_file="$2"; shift 2 ;;
    --env) [ $# -ge 2 ] || die "--env needs text"; env_text="$2"; shift 2 ;;
    --bin) [ $# -ge 2 ] || die "--bin needs a path"; bins+=("$2"); shift 2 ;;
    --file) [ $# -ge 2 ] || die "--file needs a path"; files+=("$2"); shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$initrd" ] || die "--initrd PATH is required"

mapfile -t built < <(bash "$here/build-guest.sh" --out "$out") || true
[ ${#built[@]} -eq 2 ] && [ -s "${built[0]}" ] && [ -s "${built[1]}" ] \
  || die "build-guest.sh failed (see its messages above)"
vmlinuz="${built[0]}" base="${built[1]}"

work="$(mktemp -d "$(dirname "$initrd")/.pack.XXXXXX")"
trap 'rm -rf "$work"' EXIT
ov="$work/overlay"
mkdir -p "$ov/etc/rdma-guest" "$ov/opt/ferry/bin"
[ -z "$tests_file" ] || cp "$tests_file" "$ov/etc/rdma-guest/tests"
[ -z "$env_text" ] || printf '%s\n' "$env_text" > "$ov/etc/rdma-guest/run.env"

GUEST_ROOT="$ov"
# shellcheck source=tests/rdma/guest-copy.sh
. "$here/guest-copy.sh"
for b in "${bins[@]}"; do
  [ -f "$b" ] && [ -x "$b" ] || die "--bin '$b' is not an executable file"
  copy_elf "$b"
  ln -sfn "$(realpath "$(dirname "$b")")/$(basename "$b")" "$ov/opt/ferry/bin/$(basename "$b")"
done
for f in "${files[@]}"; do
  [ -f "$f" ] || die "--file '$f' is not a file"
  copy_path "$f"
done
(cd "$ov" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$work/overlay.cpio" \
  || die "cpio failed while packing the per-run overlay"
# Concatenated newc archives are unpacked in order by the kernel.
cat "$base" "$work/overlay.cpio" > "$initrd"
echo "$vmlinuz"
echo "$initrd"
