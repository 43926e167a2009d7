# Sourced by build-guest.sh and run-guest.sh: copy host files into a guest root directory.
# The caller sets GUEST_ROOT and defines die().
#
# Paths are canonicalised (realpath of the directory) so the image never holds a directory
# where the base has a symlink (bin -> usr/bin): the kernel's cpio unpacker would replace it.

# copy_path SRC: SRC (dereferenced) to $GUEST_ROOT/realpath(dirname SRC)/basename.
copy_path() {
  local src="$1" dir dest
  [ -e "$src" ] || die "cannot copy '$src' into the guest: no such file"
  dir="$(realpath "$(dirname "$src")")"
  dest="$GUEST_ROOT$dir/$(basename "$src")"
  [ -e "$dest" ] && return 0
  mkdir -p "$GUEST_ROOT$dir"
  cp -L "$src" "$dest" || die "copying $src into the guest failed"
}

# copy_elf FILE: FILE plus its ldd closure (ldd does not list dlopen()ed providers).
copy_elf() {
  local f="$1" line lib out_ldd
  copy_path "$f"
  out_ldd="$(ldd "$f" 2>&1 || true)"
  case "$out_ldd" in *"not a dynamic executable"*|*"statically linked"*) return 0 ;; esac
  while IFS= read -r line; do
    case "$line" in
      *"not found"*) die "ldd $f: ${line#"${line%%[![:space:]]*}"}" ;;
      *"=> /"*) lib="${line#*=> }"; lib="${lib%% (*}" ;;
      *[[:space:]]/*) lib="${line#"${line%%/*}"}"; lib="${lib%% (*}" ;;
      *) continue ;;
    esac
    copy_path "$lib"
  done <<<"$out_ldd"
}
