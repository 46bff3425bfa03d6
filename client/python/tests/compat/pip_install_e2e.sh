#!/usr/bin/env bash
# A plain `pip install ./client/python` end to end, as a user runs it: no
# bazel command by hand and none of setup.py's STATECACHE_* variables, so
# setup.py itself runs `bazel build //client/python:libstatecache_dataplane.so`
# and bundles the library. Then, from outside the checkout,
# tests/compat/torch_smoke.py runs statecache.torch's decode op on the CPU
# backend of a real statecached. setup.py's bazel path cannot run inside a
# bazel test (no nested bazel), so .ci/test.sh runs this after `bazel test`
# (//client/python:install_test covers the prebuilt and no-library paths):
#   bash client/python/tests/compat/pip_install_e2e.sh
# The fresh venv sees torch, numpy, grpcio and the build tools of the torch
# venv of .ci/setup_extra.sh through a .pth file, so nothing is downloaded
# (--no-index; --no-build-isolation: setuptools / grpcio-tools from there);
# statecache itself is installed into the fresh venv. statecached:
# $STATECACHED, else `bazel build //server:statecached`. Prints
# "pip_install_e2e: PASS" and exits 0, or exits 1.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
torch_venv=${STATECACHE_TORCH_VENV:-$home_dir/.cache/statecache-venv-torch}
fail() { echo "pip_install_e2e: FAIL: $*" >&2; exit 1; }
[ -x "$torch_venv/bin/python" ] || fail "no torch venv at $torch_venv: run bash .ci/setup_extra.sh"
command -v bazel >/dev/null || fail "no bazel on PATH"
unset STATECACHE_DATAPLANE_LIB STATECACHE_BUILD_NATIVE STATECACHE_PREBUILT_DATAPLANE_LIB \
  PYTHONPATH
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

statecached=${STATECACHED:-}
if [ -z "$statecached" ]; then
  (cd "$repo" && bazel build //server:statecached >"$tmp/bazel.log" 2>&1) || {
    cat "$tmp/bazel.log" >&2; fail "bazel build //server:statecached"; }
  statecached="$(cd "$repo" && bazel info bazel-bin 2>/dev/null)/server/statecached"
fi
[ -x "$statecached" ] || fail "no statecached at $statecached"

"$torch_venv/bin/python" -m venv "$tmp/venv"
py=$tmp/venv/bin/python
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
purelib "$torch_venv/bin/python" >"$(purelib "$py")/statecache-e2e-torch-venv.pth"
# venv's own setuptools (65 for Python 3.11) has no bdist_wheel: build with
# the torch venv's (what an isolated build would fetch: setuptools>=64, new).
"$py" -m pip uninstall -q -y --disable-pip-version-check setuptools

"$py" -m pip install -v --disable-pip-version-check --no-index --no-build-isolation \
  "$repo/client/python" >"$tmp/pip.log" 2>&1 || {
  tail -60 "$tmp/pip.log" >&2; fail "pip install ./client/python"; }
grep -qF "statecache: bazel build //client/python:libstatecache_dataplane.so" "$tmp/pip.log" || {
  tail -60 "$tmp/pip.log" >&2; fail "setup.py did not run the bazel build"; }
grep -F "statecache: bundled" "$tmp/pip.log" || {
  tail -60 "$tmp/pip.log" >&2; fail "setup.py bundled no library"; }

(cd "$tmp" && "$py" "$repo/client/python/tests/compat/torch_smoke.py" "$statecached" \
  "$tmp/venv") || fail "torch_smoke.py"
echo "pip_install_e2e: PASS"
