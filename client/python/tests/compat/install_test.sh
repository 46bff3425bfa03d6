#!/usr/bin/env bash
# //client/python:install_test: builds the statecache wheel with the newest
# grpcio-tools (as pip's isolated build would) and installs it, by pip's
# resolver with no index, into copies of the oldest and newest runtime venvs
# of .ci/setup_extra.sh (tests/compat/{oldest,newest}.txt). Checks that pip
# changed no installed version (the declared ranges accept the pins), that
# the installed package reports those versions, and runs a smoke call
# against a real statecached (tests/compat/smoke.py). Fails, never skips,
# when a venv is missing.
# The attached-mode library: a nested bazel cannot run inside this test, so
# the wheel bundles the Bazel-built libstatecache_dataplane.so of this test's
# data through STATECACHE_PREBUILT_DATAPLANE_LIB (setup.py's bundling path;
# its bazel path is tests/compat/pip_install_e2e.sh, run by .ci/test.sh).
# Checked: the wheel is a platform wheel whose statecache/_native/ holds the
# library byte-identical to Bazel's, and attached mode works from it; a
# second wheel of the same sources without a prebuilt (setup.py finds no
# repository around them) holds none, its build log warns, and
# AttachedSession then names the reason and the fixes; settings setup.py
# cannot honour fail the build with a message naming the variable.
set -euo pipefail
if [ -n "${TEST_SRCDIR:-}" ]; then
  pkg=$TEST_SRCDIR/statecache/client/python
else
  pkg="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fi
here=$pkg/tests/compat
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
tmp=${TEST_TMPDIR:-$(mktemp -d)}
statecached=${STATECACHED:-}
lib=${DATAPLANE_LIB:-}
if [ -n "${TEST_SRCDIR:-}" ]; then
  statecached=${statecached:-$TEST_SRCDIR/statecache/server/statecached}
  lib=${lib:-$TEST_SRCDIR/statecache/client/python/libstatecache_dataplane.so}
fi
[ -x "$statecached" ] || { echo "install_test: no statecached ($statecached)" >&2; exit 1; }
[ -f "$lib" ] || { echo "install_test: no libstatecache_dataplane.so ($lib)" >&2; exit 1; }
unset STATECACHE_DATAPLANE_LIB STATECACHE_BUILD_NATIVE STATECACHE_PREBUILT_DATAPLANE_LIB
# smoke.py runs without TEST_SRCDIR: find_library must not find the runfile.

venv_of() { echo "$home_dir/.cache/statecache-venv-$1"; }
for name in oldest newest; do
  [ -x "$(venv_of $name)/bin/python" ] || {
    echo "install_test: no venv $(venv_of $name); run: bash .ci/setup_extra.sh" >&2; exit 1; }
done

# The package sources as an sdist would hold them (runfiles are symlinks).
src=$tmp/src
mkdir -p "$src/statecache/_proto/statecache/v1" "$src/statecache/integrations"
cp -L "$pkg"/{setup.py,pyproject.toml,README.md,MANIFEST.in} "$src/"
cp -L "$pkg"/statecache/*.py "$pkg"/statecache/_prefixhash.c "$pkg"/statecache/py.typed \
  "$src/statecache/"
cp -L "$pkg"/statecache/integrations/*.py "$src/statecache/integrations/"
proto=$(find -L "${TEST_SRCDIR:-$pkg/../..}" -path '*proto/statecache/v1/statecache.proto' \
  -print -quit)
cp -L "$proto" "$src/statecache/_proto/statecache/v1/"

# build_wheel DIR LOG [VAR=VALUE...]: one wheel of $src into DIR, with the
# given environment; pip -v puts setup.py's messages into LOG.
build_wheel() {
  local dir=$1 log=$2
  shift 2
  env "$@" "$(venv_of newest)/bin/python" -m pip wheel -v --disable-pip-version-check \
    --no-deps --no-build-isolation --no-index -w "$dir" "$src" >"$log" 2>&1 || {
    cat "$log" >&2; echo "install_test: pip wheel failed" >&2; exit 1; }
}

wheels=$tmp/wheels
build_wheel "$wheels" "$tmp/wheel.log" STATECACHE_PREBUILT_DATAPLANE_LIB="$lib"
whl=$(ls "$wheels"/statecache-*.whl)
case "$whl" in
  *-none-any.whl) echo "install_test: $whl is not a platform wheel" >&2; exit 1 ;;
esac
"$(venv_of newest)/bin/python" - "$whl" "$lib" <<'PY'
import sys, zipfile
whl, lib = sys.argv[1:3]
with zipfile.ZipFile(whl) as z:
    names = z.namelist()
    got = z.read("statecache/_native/libstatecache_dataplane.so")
with open(lib, "rb") as f:
    assert got == f.read(), "the bundled library differs from Bazel's"
assert "statecache/_native/NOT_BUILT" not in names, names
print(f"install_test: {whl.rsplit('/', 1)[1]} bundles the library ({len(got)} bytes)")
PY

# Without the library: the same sources, no prebuilt, outside a repository
# (and the first build's build/ tree left in place: no stale library).
bare=$tmp/wheels-bare
why="not built from the statecache repository"
build_wheel "$bare" "$tmp/wheel-bare.log"
grep -qF "WARNING: statecache: installing without libstatecache_dataplane.so ($why)" \
  "$tmp/wheel-bare.log" || {
  cat "$tmp/wheel-bare.log" >&2; echo "install_test: no warning in the bare build" >&2; exit 1; }
"$(venv_of newest)/bin/python" - "$bare"/statecache-*.whl "$why" <<'PY'
import sys, zipfile
whl, why = sys.argv[1:3]
with zipfile.ZipFile(whl) as z:
    names = z.namelist()
    note = z.read("statecache/_native/NOT_BUILT").decode()
assert "statecache/_native/libstatecache_dataplane.so" not in names, names
assert note == why + "\n", note
PY

# Settings that cannot be honoured fail the build, naming the variable.
# wheel_fails NEEDLE VAR=VALUE...: pip wheel fails and its log holds NEEDLE.
wheel_fails() {
  local needle=$1 log=$tmp/wheel-fail.log
  shift
  if env "$@" "$(venv_of newest)/bin/python" -m pip wheel -v --disable-pip-version-check \
      --no-deps --no-build-isolation --no-index -w "$tmp/wheels-fail" "$src" >"$log" 2>&1; then
    echo "install_test: pip wheel with $* succeeded" >&2; exit 1
  fi
  grep -qF "$needle" "$log" || {
    cat "$log" >&2; echo "install_test: no '$needle' in the failed build" >&2; exit 1; }
}
wheel_fails "STATECACHE_BUILD_NATIVE=bazel: $why" STATECACHE_BUILD_NATIVE=bazel
wheel_fails "STATECACHE_BUILD_NATIVE='cuda': want one of auto, bazel, off" \
  STATECACHE_BUILD_NATIVE=cuda
wheel_fails "STATECACHE_PREBUILT_DATAPLANE_LIB='$tmp/none.so': no such file" \
  STATECACHE_PREBUILT_DATAPLANE_LIB="$tmp/none.so"
wheel_fails "STATECACHE_PREBUILT_DATAPLANE_LIB and STATECACHE_BUILD_NATIVE=off contradict" \
  STATECACHE_PREBUILT_DATAPLANE_LIB="$lib" STATECACHE_BUILD_NATIVE=off

for name in oldest newest; do
  venv=$tmp/venv-$name
  cp -a "$(venv_of $name)" "$venv"
  py=$venv/bin/python
  before=$("$py" -m pip freeze --disable-pip-version-check | sort)
  "$py" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" \
    statecache
  after=$("$py" -m pip freeze --disable-pip-version-check | grep -v '^statecache' | sort)
  if [ "$before" != "$after" ]; then
    echo "install_test[$name]: pip changed the environment:" >&2
    diff <(echo "$before") <(echo "$after") >&2 || true
    exit 1
  fi
  (cd "$tmp" && env -u TEST_SRCDIR "$py" "$here/smoke.py" "$statecached" "$here/$name.txt" bundled)
  echo "install_test[$name]: ok"
done

py=$tmp/venv-newest/bin/python
"$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --force-reinstall \
  --find-links "$bare" statecache
(cd "$tmp" && env -u TEST_SRCDIR "$py" "$here/smoke.py" "$statecached" "$here/newest.txt" "absent:$why")
echo "install_test[newest, no library]: ok"
