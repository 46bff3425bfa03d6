#!/usr/bin/env bash
# Installs what statecache needs from Debian packages, idempotently: packages
# already present are not reinstalled and apt-get update runs only when
# something is missing. CUDA 13 is expected at /usr/local/cuda (nvcc only; no
# GPU is needed to build).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap
  libgrpc++-dev
  protobuf-compiler-grpc
  protobuf-compiler
  libprotobuf-dev
  libabsl-dev
  prometheus-cpp-dev
  libgtest-dev
  libgmock-dev
  libssl-dev
  zlib1g-dev
  libhiredis-dev
  redis-server
  openssl
  clang
  libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: /usr/local/cuda/bin/nvcc not found; the CUDA 13 toolkit is required to build" >&2
  exit 1
fi
bash "$(dirname "${BASH_SOURCE[0]}")/setup_extra.sh"
