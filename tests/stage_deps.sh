# Sourced by the device staging scripts (tests/*/stage_device.sh,
# client/vllm/device/stage.sh).
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
