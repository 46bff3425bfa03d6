#!/usr/bin/env bash
# Installs what the ecosystem tests need, idempotently and fast when present:
#  - Debian's `prometheus` package (promtool + the Prometheus server), used by
#    //deploy:promtool_test and //tests/prometheus:prometheus_test;
#  - a Python venv at ~/.cache/statecache-venv (override: STATECACHE_VENV)
#    with client/python/requirements-test.txt, used by //client/python tests;
#  - venvs ~/.cache/statecache-venv-{oldest,newest} with the runtime pins of
#    client/python/tests/compat/{oldest,newest}.txt, used by
#    //client/python:install_test.
# A venv is rebuilt only when its requirements file or the interpreter
# changes (a stamp file records both). Run from anywhere; root or sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

if ! dpkg -s prometheus >/dev/null 2>&1; then
  echo "setup_extra: installing prometheus (promtool + server)"
  $SUDO apt-get update -q
  # --no-install-recommends: no node exporter. The tests run their own
  # server on loopback; the package's system service is not used.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    prometheus
fi
for tool in /usr/bin/promtool /usr/bin/prometheus; do
  [ -x "$tool" ] || { echo "setup_extra: $tool missing after install" >&2; exit 1; }
done

PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "setup_extra: installing python3-venv"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-venv
fi

HOME_DIR=$(getent passwd "$(id -u)" | cut -d: -f6)

# build_venv DIR REQUIREMENTS: (re)builds DIR unless its stamp matches.
build_venv() {
  local venv=$1 req=$2 want
  want="$("$PY" -c 'import sys; print(sys.version)' | head -1) $(sha256sum "$req" | cut -d' ' -f1)"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.statecache-stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "setup_extra: building Python venv $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  echo "$want" >"$venv/.statecache-stamp"
}

build_venv "${STATECACHE_VENV:-$HOME_DIR/.cache/statecache-venv}" client/python/requirements-test.txt
for pins in oldest newest; do
  build_venv "$HOME_DIR/.cache/statecache-venv-$pins" "client/python/tests/compat/$pins.txt"
done
build_venv "${STATECACHE_TORCH_VENV:-$HOME_DIR/.cache/statecache-venv-torch}" \
  client/python/requirements-torch.txt
