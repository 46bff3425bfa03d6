"""Fixtures of the plugin's CPU tests (no vLLM: test_vllm_stubbed.py stands
in for the few vLLM names the layer uses).

- sys.path: client/vllm (statecache_vllm) and client/python (statecache).
- The gRPC stubs of statecache are generated into a temporary folder by
  `python -m statecache._gen` in a child process, as client/python's tests do.
- TRITON_INTERPRET=1: the plugin's Triton kernels run on the CPU.
- `paths`: statecached and libstatecache_dataplane.so from $STATECACHED /
  $STATECACHE_DATAPLANE_LIB (run_tests.sh sets them from Bazel's runfiles),
  else this checkout's bazel-bin. Missing binaries FAIL the tests that need
  them (never skip).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

# Triton kernels of the plugin (decode_prep.py) run in Triton's interpreter
# on this GPU-less machine; set before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_ROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PLUGIN_ROOT))
PY_ROOT = os.path.join(REPO, "client", "python")
for p in (PLUGIN_ROOT, PY_ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

import statecache  # noqa: E402

_STUBS = tempfile.mkdtemp(prefix="statecache-stubs-", dir=os.environ.get("TEST_TMPDIR"))
subprocess.run([sys.executable, "-m", "statecache._gen", "--out", _STUBS, "--proto_root",
                os.path.join(REPO, "proto")], check=True, cwd=PY_ROOT,
               stdout=subprocess.DEVNULL)
statecache.__path__.append(os.path.join(_STUBS, "statecache"))


def _find(env: str, rel: str) -> str:
    p = os.environ.get(env) or os.path.join(REPO, "bazel-bin", rel)
    if not os.path.isfile(p):
        pytest.fail(f"{rel} not found (set ${env} or bazel build //{os.path.dirname(rel)}:"
                    f"{os.path.basename(rel)})")
    return os.path.abspath(p)


@pytest.fixture(scope="session")
def paths():
    lib = _find("STATECACHE_DATAPLANE_LIB", "client/python/libstatecache_dataplane.so")
    os.environ["STATECACHE_DATAPLANE_LIB"] = lib
    return {"statecached": _find("STATECACHED", "server/statecached"), "library": lib}
