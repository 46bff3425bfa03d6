"""Fixtures of the statecache Python tests.

- The gRPC stubs are generated fresh from proto/ into a temporary folder
  before any test runs, by `python -m statecache._gen --out DIR` in a child
  process (grpc_tools must not be loaded next to statecache.attached's
  library: see README, attached mode).
- statecache.prefix loads the C chain from $STATECACHE_PREFIX_LIB, set here
  to Bazel's libstatecache_prefix.so when present (the Bazel test requires
  it: STATECACHE_REQUIRE_NATIVE_PREFIX=1).
- `server` starts the real statecached (CPU backend, 127.0.0.1, ephemeral
  gRPC and metrics ports read from its `server_started` log line) and stops it
  with SIGTERM. The binary: $STATECACHED, else Bazel runfiles
  (server/statecached), else bazel-bin/server/statecached of this checkout.
  When it is missing the live tests skip, unless STATECACHE_REQUIRE_SERVER=1
  (set by the Bazel test), where they fail.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG_ROOT))
sys.path.insert(0, PKG_ROOT)


def _prefix_lib():
    """The C prefix chain built by Bazel (runfiles, else bazel-bin)."""
    roots = [os.path.join(os.environ["TEST_SRCDIR"], "statecache")] \
        if os.environ.get("TEST_SRCDIR") else []
    for root in roots + [os.path.join(REPO, "bazel-bin")]:
        p = os.path.join(root, "client", "python", "libstatecache_prefix.so")
        if os.path.isfile(p):
            return p
    return None


if not os.environ.get("STATECACHE_PREFIX_LIB") and _prefix_lib():
    os.environ["STATECACHE_PREFIX_LIB"] = _prefix_lib()

import statecache  # noqa: E402

_STUBS = tempfile.mkdtemp(prefix="statecache-stubs-", dir=os.environ.get("TEST_TMPDIR"))
# In a child process: grpc_tools bundles its own C++ protobuf, whose
# GNU-unique symbols would clash with the system libprotobuf that
# libstatecache_dataplane.so (statecache.attached) loads into this process.
subprocess.run([sys.executable, "-m", "statecache._gen", "--out", _STUBS, "--proto_root",
                os.path.join(REPO, "proto")], check=True, cwd=PKG_ROOT,
               stdout=subprocess.DEVNULL)
statecache.__path__.append(os.path.join(_STUBS, "statecache"))

RING_VECTORS = os.path.join(REPO, "client", "routing", "testdata", "ring_vectors.tsv")


def find_statecached():
    candidates = [os.environ.get("STATECACHED")]
    if os.environ.get("TEST_SRCDIR"):
        candidates.append(os.path.join(os.environ["TEST_SRCDIR"], "statecache", "server",
                                       "statecached"))
    candidates.append(os.path.join(REPO, "bazel-bin", "server", "statecached"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


class Server:
    """A running statecached; `log` holds its stderr lines."""

    def __init__(self, binary, extra_args=()):
        self.log = []
        self._started = threading.Event()
        self.port = self.metrics_port = 0
        args = [binary, "--listen=127.0.0.1:0", "--metrics_port=0", "--backend=cpu",
                f"--state_memory_bytes={64 << 20}", f"--checkpoint_memory_bytes={16 << 20}",
                "--lease_default_ms=5000", *extra_args]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._started.wait(30) or not self.port:
            self.stop()
            raise RuntimeError("statecached did not start:\n" + "".join(self.log))

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"server_started .* port=(\d+) .* metrics_port=(-?\d+)", line)
            if m:
                self.port, self.metrics_port = int(m.group(1)), int(m.group(2))
                self._started.set()
        self._started.set()

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def statecached_binary():
    b = find_statecached()
    if b is None:
        msg = "statecached binary not found (bazel build //server:statecached or set STATECACHED)"
        if os.environ.get("STATECACHE_REQUIRE_SERVER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return b


@pytest.fixture(scope="module")
def server(statecached_binary):
    s = Server(statecached_binary)
    yield s
    rc = s.stop()
    assert rc == 0, "statecached exited with %r:\n%s" % (rc, "".join(s.log))


@pytest.fixture(scope="module")
def client(server):
    c = statecache.Client(server.target, timeout=30)
    c.wait_ready(10)
    yield c
    c.close()
