#!/usr/bin/env bash
# Builds (or reuses) the Soft-RoCE test guest: Debian's generic kernel plus a base
# initramfs holding busybox, the rxe/ib_uverbs modules, rdma-core's libibverbs with the
# rxe provider, iproute2 and perftest. See tests/rdma/README.md.
#
# usage: tests/rdma/build-guest.sh [--out DIR] [--quiet]
#
# DIR (default: <repo>/build/rdma-guest) caches the kernel .deb (downloads/), one
# vmlinuz and one base initramfs per kernel package version, and holds two stable names
# for run-guest.sh: DIR/vmlinuz and DIR/base.cpio (symlinks to the current ones).
# Idempotent: a second call with nothing changed only asks apt-cache which kernel is current (~1 s).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/build/rdma-guest"
quiet=0

die() { echo "build-guest: error: $*" >&2; exit 1; }
first() { local f; for f in "$@"; do [ -e "$f" ] && { echo "$f"; return 0; }; done; return 0; }
log() { [ "$quiet" -eq 1 ] || echo "build-guest: $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --quiet) quiet=1; shift ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
mkdir -p "$out" || die "cannot create output directory $out"
out="$(cd "$out" && pwd)"

# ---------------------------------------------------------------------------------------
# 1. Host packages. rdma-core itself is not needed (it only ships udev rules and systemd
#    units, and would pull systemd+udev into the host): libibverbs1 + ibverbs-providers
#    are the user-space verbs stack, iproute2 provides `rdma`.
host_packages=(
  qemu-system-x86 busybox-static cpio xz-utils zstd coreutils
  libibverbs1 libibverbs-dev ibverbs-providers ibverbs-utils perftest iproute2
)
ensure_host_packages() {
  local missing=() p sudo=""
  for p in "${host_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "missing host packages (${missing[*]}) and no sudo to install them"
    sudo="sudo"
  fi
  log "installing host packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || die "apt-get update failed (needed to install ${missing[*]})"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
}
ensure_host_packages

# ---------------------------------------------------------------------------------------
# 2. Which kernel: whatever linux-image-amd64 depends on right now (never hard-code the
#    ABI: old ones leave the archive). The -cloud-amd64 flavour lacks rdma_rxe.
apt_updated=0
apt_update() {
  [ "$apt_updated" -eq 1 ] && return 1
  apt_updated=1
  log "apt-get update"
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq; else sudo apt-get update -qq; fi
}
resolve_kernel() {   # sets kpkg/kver; one apt-cache call (~1 s each without pkgcache.bin)
  local dep
  dep="$(apt-cache show --no-all-versions linux-image-amd64 2>/dev/null | sed -n 's/^Depends: //p' \
         | tr ',' '\n' | awk '$1 ~ /^linux-image-[0-9].*-amd64$/ && !k { k = $0 } END { print k }')"
  kpkg="$(awk '{ print $1 }' <<<"$dep")"
  kver="$(sed -n 's/.*(= *\([^)]*\)).*/\1/p' <<<"$dep")"   # the metapackage pins "(= VERSION)"
  if [ -n "$kpkg" ] && [ -z "$kver" ]; then
    kver="$(apt-cache show --no-all-versions "$kpkg" 2>/dev/null | awk '/^Version:/ && !v { v = $2 } END { print v }')"
  fi
}
resolve_kernel
if [ -z "$kpkg" ] || [ -z "$kver" ]; then
  apt_update || true
  resolve_kernel
fi

dl="$out/downloads"
mkdir -p "$dl"
cached_deb() {   # cached_deb PKG VERSION: path of a cached, intact .deb of that version
  local f
  for f in "$dl/${1}_"*_amd64.deb; do
    [ -f "$f" ] && [ "$(dpkg-deb -f "$f" Version 2>/dev/null || true)" = "$2" ] && { echo "$f"; return 0; }
  done
  return 0
}
fetch_deb() {
  log "downloading $kpkg $kver (~70 MB)"
  (cd "$dl" && apt-get download -q=2 "$kpkg=$kver" 2>&1 | grep -v 'Download is performed unsandboxed' >&2) || true
  cached_deb "$kpkg" "$kver"
}
deb=""
if [ -n "$kpkg" ] && [ -n "$kver" ]; then
  deb="$(cached_deb "$kpkg" "$kver")"
  [ -n "$deb" ] || deb="$(fetch_deb)"
  if [ -z "$deb" ] && apt_update; then   # stale lists: that version may have left the mirror
    resolve_kernel
    deb="$(cached_deb "$kpkg" "$kver")"
    [ -n "$deb" ] || deb="$(fetch_deb)"
  fi
  [ -n "$deb" ] || die "apt-get download $kpkg=$kver failed (network? see messages above)"
  for f in "$dl"/*.deb; do [ "$f" = "$deb" ] || rm -f "$f"; done   # keep one kernel
else
  # apt knows nothing and cannot update (offline): fall back to the newest cached kernel.
  deb=""
  for f in "$dl"/linux-image-*-amd64_*_amd64.deb; do
    case "$f" in *cloud*) continue ;; esac
    [ -f "$f" ] && { [ -z "$deb" ] || [ "$f" -nt "$deb" ]; } && deb="$f"
  done
  [ -n "$deb" ] || die "cannot resolve linux-image-amd64 with apt-cache (even after apt-get update) and no kernel is cached in $dl"
  kpkg="$(dpkg-deb -f "$deb" Package)"; kver="$(dpkg-deb -f "$deb" Version)"
  log "warning: apt-cache cannot resolve linux-image-amd64; using cached $kpkg $kver"
fi
case "$kpkg" in *cloud*) die "$kpkg is the cloud flavour, which has no rdma_rxe" ;; esac

# ---------------------------------------------------------------------------------------
# 3. Cache key: kernel package + version, plus everything that goes into the base image
#    (guest scripts, this script, versions of the host packages copied into the guest).
key_inputs() {
  echo "$kpkg $kver"
  cat "${BASH_SOURCE[0]}" "$here/guest-copy.sh" "$here/guest/init" "$here/guest/rdma-pair" "$here/guest/perftest-metrics.awk"
  dpkg-query -W -f='${Package} ${Version}\n' busybox-static coreutils libibverbs1 ibverbs-providers \
    ibverbs-utils perftest iproute2 libc6 2>/dev/null
}
hash="$(key_inputs | sha256sum | cut -c1-12)"
kkey="$(printf '%s_%s' "$kpkg" "$kver" | tr -c 'A-Za-z0-9._+\n-' '_')"
vmlinuz="$out/$kkey.vmlinuz"
base="$out/base-$kkey-$hash.cpio"

if [ -s "$vmlinuz" ] && [ -s "$base" ]; then
  log "up to date: $kpkg $kver (base $hash)"
else
  log "building base initramfs for $kpkg $kver"
  work="$(mktemp -d "$out/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  kx="$work/kernel"; root="$work/root"
  mkdir -p "$kx" "$root"
  dpkg -x "$deb" "$kx" || die "dpkg -x $deb failed (corrupt download? delete it and retry)"
  modroot="$(first "$kx"/lib/modules/*/ "$kx"/usr/lib/modules/*/)"
  [ -n "$modroot" ] || die "no lib/modules/<version>/ in $deb"
  kimg="$(first "$kx"/boot/vmlinuz-*)"
  [ -n "$kimg" ] || die "no boot/vmlinuz-* in $deb"

  # -- root skeleton, mirroring the host's merged-/usr symlinks (bin -> usr/bin, ...) --
  mkdir -p "$root"/{proc,sys,dev,tmp,run,root,etc,usr/bin,usr/sbin,usr/lib,var/log}
  for d in bin sbin lib lib64 lib32 libx32; do
    if [ -L "/$d" ]; then
      t="$(readlink "/$d")"; t="${t#/}"
      mkdir -p "$root/$t"; ln -s "$t" "$root/$d"
    elif [ -d "/$d" ]; then
      mkdir -p "$root/$d"
    fi
  done

  GUEST_ROOT="$root"
  # shellcheck source=tests/rdma/guest-copy.sh
  . "$here/guest-copy.sh"

  # -- busybox and its applets (real tools copied later win over applet links) --
  bb="$(command -v busybox)"; [ -n "$bb" ] || die "busybox not found (package busybox-static)"
  case "$(ldd "$bb" 2>&1 || true)" in
    *"not a dynamic"*|*"statically linked"*) ;;
    *) die "$bb is not static (install busybox-static)" ;;
  esac
  copy_path "$bb"
  bbguest="$(realpath "$(dirname "$bb")")/busybox"

  # -- user-space tools (full paths matter: busybox's shell runs its own applets first) --
  tool() { local p; p="$(command -v "$1" 2>/dev/null)" || die "host tool '$1' not found (packages: ${host_packages[*]})"; echo "$p"; }
  IP="$(tool ip)"; RDMA="$(tool rdma)"; TIMEOUT="$(tool timeout)"
  tools=("$IP" "$RDMA" "$TIMEOUT" "$(tool ibv_devinfo)" "$(tool ibv_devices)" "$(tool ibv_rc_pingpong)")
  for t in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do tools+=("$(tool "$t")"); done
  for t in "${tools[@]}"; do copy_elf "$t"; done

  # -- the rxe provider, dlopen()ed by libibverbs via /etc/libibverbs.d/rxe.driver --
  libdir="$(dirname "$(ldd "$(tool ibv_devinfo)" | awk '/libibverbs\.so/ && !l { l = $3 } END { print l }')")"
  prov="$(first "$libdir"/libibverbs/librxe-rdmav*.so)"
  [ -n "$prov" ] || die "no librxe-rdmav*.so under $libdir/libibverbs (package ibverbs-providers)"
  copy_elf "$prov"
  [ -f /etc/libibverbs.d/rxe.driver ] || die "/etc/libibverbs.d/rxe.driver missing (package ibverbs-providers)"
  copy_path /etc/libibverbs.d/rxe.driver

  # busybox applet links, skipping names a real tool already occupies
  while IFS= read -r a; do
    [ -e "$root/$a" ] || [ -L "$root/$a" ] && continue
    mkdir -p "$root/$(dirname "$a")"
    ln -s "$bbguest" "$root/$a"
  done < <("$bb" --list-full)

  # -- kernel modules: dependency closure read from each module's .modinfo --
  declare -A modpath=() builtin=() seen=()
  while IFS= read -r f; do
    n="$(basename "$f")"; n="${n%%.ko*}"; n="${n//-/_}"
    modpath[$n]="$f"
  done < <(find "$modroot" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz')
  if [ -f "$modroot/modules.builtin" ]; then
    while IFS= read -r f; do n="$(basename "$f")"; n="${n%%.ko*}"; builtin[${n//-/_}]=1; done < "$modroot/modules.builtin"
  fi
  mdir="$root/usr/lib/rdma-guest/modules"; mkdir -p "$mdir"
  order=()
  add_module() {   # add_module NAME [optional]
    local n="${1//-/_}" f dep deps
    [ -n "${seen[$n]:-}" ] && return 0
    seen[$n]=1
    [ -n "${builtin[$n]:-}" ] && return 0
    f="${modpath[$n]:-}"
    if [ -z "$f" ]; then
      [ "${2:-}" = optional ] && { log "note: module $n not in $kpkg (skipped)"; return 0; }
      die "kernel module $n not found in $kpkg"
    fi
    case "$f" in
      *.ko) cp "$f" "$mdir/$n.ko" ;;
      *.ko.xz) xz -dc "$f" > "$mdir/$n.ko" ;;
      *.ko.zst) zstd -q -dc "$f" > "$mdir/$n.ko" ;;
      *.ko.gz) gzip -dc "$f" > "$mdir/$n.ko" ;;
    esac || die "decompressing $f failed"
    deps="$(tr '\0' '\n' < "$mdir/$n.ko" | sed -n 's/^depends=//p')"
    for dep in ${deps//,/ }; do add_module "$dep"; done
    order+=("$n")
  }
  # crc32_generic first: rxe asks the crypto API for "crc32", which would need modprobe.
  add_module crc32_generic optional
  # virtio_pci + virtio_net: the NIC of each guest two-guest.py joins by a wire.
  for m in dummy virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm; do add_module "$m"; done
  printf '%s\n' "${order[@]}" > "$root/usr/lib/rdma-guest/modules.order"
  log "modules: ${order[*]}"

  # -- guest scripts and configuration --
  install -m 0755 "$here/guest/init" "$root/init"
  mkdir -p "$root/usr/local/bin" "$root/etc/rdma-guest"
  install -m 0755 "$here/guest/rdma-pair" "$root/usr/local/bin/rdma-pair"
  install -m 0644 "$here/guest/perftest-metrics.awk" "$root/usr/lib/rdma-guest/perftest-metrics.awk"
  {
    echo "IP=$IP"; echo "RDMA=$RDMA"; echo "TIMEOUT=$TIMEOUT"
    echo "KERNEL='$kpkg $kver'"
  } > "$root/etc/rdma-guest/tools.env"
  echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
  echo "root:x:0:" > "$root/etc/group"

  # -- pack: uncompressed newc (faster than gzip under TCG) --
  (cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$work/base.cpio" \
    || die "cpio failed while packing the base initramfs"
  cp "$kimg" "$work/vmlinuz"
  rm -f "$out"/base-*.cpio "$out"/*.vmlinuz   # keep one version in the cache
  mv "$work/vmlinuz" "$vmlinuz"
  mv "$work/base.cpio" "$base"
  rm -rf "$work"; trap - EXIT
  log "base initramfs: $(du -h "$base" | cut -f1), kernel: $(basename "$kimg")"
fi

ln -sfn "$(basename "$vmlinuz")" "$out/vmlinuz"
ln -sfn "$(basename "$base")" "$out/base.cpio"
echo "$out/vmlinuz"
echo "$out/base.cpio"
