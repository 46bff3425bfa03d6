# Sourced by the device staging scripts (tests/*/stage_device.sh,
# client/vllm/device/stage.sh).
# stage_binary SRC DIR LIBDIR [NAME]: copies the binary or library SRC into
# DIR (as NAME, default its own name; symbols stripped: a smaller bundle) and
# the libraries it needs into LIBDIR.
stage_binary() {
  local src=$1 dir=$2 libdir=$3
  local dst="$dir/${4:-$(basename "$src")}"
  cp -Lf "$src" "$dst"
  chmod u+w "$dst" && strip --strip-unneeded "$dst"
  copy_deps "$src" "$libdir"
}
# copy_deps BINARY DEST: copies the shared libraries BINARY resolves (ldd)
# into DEST, except glibc, the compiler runtime and the driver's libcuda,
# which every device machine has; a library already in DEST is kept.
copy_deps() {
  local bin=$1 dest=$2
  ldd "$bin" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*|libcuda.so*) ;;
      *) cp -Ln "$lib" "$dest/" 2>/dev/null || true ;;
    esac
  done
}
