#!/usr/bin/env bash
# //client/python:install_test: builds the statecache wheel with the newest
# grpcio-tools (as pip's isolated build would) and installs it, by pip's
# resolver with no index, into copies of the oldest and newest runtime venvs
# of .ci/setup_extra.sh (tests/compat/{oldest,newest}.txt). Checks that pip
# changed no installed version (the declared ranges accept the pins), that
# the installed package reports those versions, and runs a smoke call
# against a real statecached (tests/compat/smoke.py). Fails, never skips,
# when a venv is missing.
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
if [ -z "$statecached" ] && [ -n "${TEST_SRCDIR:-}" ]; then
  statecached=$TEST_SRCDIR/statecache/server/statecached
fi
[ -x "$statecached" ] || { echo "install_test: no statecached ($statecached)" >&2; exit 1; }

venv_of() { echo "$home_dir/.cache/statecache-venv-$1"; }
for name in oldest newest; do
  [ -x "$(venv_of $name)/bin/python" ] || {
    echo "install_test: no venv $(venv_of $name); run: bash .ci/setup_extra.sh" >&2; exit 1; }
done

# The package sources as an sdist would hold them (runfiles are symlinks).
src=$tmp/src
mkdir -p "$src/statecache/_proto/statecache/v1"
cp -L "$pkg"/{setup.py,pyproject.toml,README.md,MANIFEST.in} "$src/"
cp -L "$pkg"/statecache/*.py "$pkg"/statecache/_prefixhash.c "$pkg"/statecache/py.typed \
  "$src/statecache/"
proto=$(find -L "${TEST_SRCDIR:-$pkg/../..}" -path '*proto/statecache/v1/statecache.proto' \
  -print -quit)
cp -L "$proto" "$src/statecache/_proto/statecache/v1/"

wheels=$tmp/wheels
"$(venv_of newest)/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
  --no-build-isolation --no-index -w "$wheels" "$src"

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
  (cd "$tmp" && "$py" "$here/smoke.py" "$statecached" "$here/$name.txt")
  echo "install_test[$name]: ok"
done
