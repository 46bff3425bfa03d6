"""Checks of an installed statecache shared by smoke.py (install_test.sh) and
torch_smoke.py (pip_install_e2e.sh): a statecached child on the CPU backend
with shared pools, the one-step inputs whose output is known in closed form,
and where the attached-mode library was found (or why not)."""
import os
import re
import subprocess
import threading

import numpy as np

import statecache as sc
import statecache.attached as attached

GEOM = sc.Geometry("gdn", layers=1, h_qk=1, h_v=2, d_k=128, d_v=128)


def start_statecached(binary):
    """(process, target) of `binary --backend=cpu --shared_pools` on an
    ephemeral loopback port (attached mode maps its pools)."""
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--metrics_port=-1",
                             "--backend=cpu", "--shared_pools",
                             f"--state_memory_bytes={16 << 20}",
                             f"--checkpoint_memory_bytes={4 << 20}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"server_started .* port=(\d+)", line)
        if m:
            # Drained from here on, so the child never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, f"127.0.0.1:{m.group(1)}"
    proc.wait(15)
    raise AssertionError(f"statecached did not start (exit {proc.returncode})")


def stop(proc):
    proc.terminate()
    proc.wait(15)


def step_inputs():
    """q = k unit [1, 1, 128], v [1, 2, 128], g, beta [1, 2] (float32) and o:
    from a zero state S = beta k v^T, so o = S^T q / sqrt(d_k) = 0.5 v / sqrt(128)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 128)).astype(np.float32)
    q /= np.linalg.norm(q)
    v = rng.standard_normal((1, 2, 128)).astype(np.float32)
    g = np.full((1, 2), -0.1, np.float32)
    beta = np.full((1, 2), 0.5, np.float32)
    return q, v, g, beta, (0.5 * v / np.sqrt(128)).astype(np.float32)


def bundled_library():
    """The library path pip installed (statecache/_native/), asserted to be
    what find_library picks with no environment override."""
    assert "STATECACHE_DATAPLANE_LIB" not in os.environ
    want = os.path.join(os.path.dirname(sc.__file__), "_native",
                        "libstatecache_dataplane.so")
    got = attached.find_library()
    assert got == want, f"find_library() = {got}, want the bundled {want}"
    return got


def assert_no_library(why):
    """An install without the library: AttachedSession's FileNotFoundError
    quotes the reason setup.py recorded and names both ways to get one."""
    try:
        attached.AttachedSession("127.0.0.1:1", "m", [sc.SlotHandle(1, 1)])
    except FileNotFoundError as e:
        msg = str(e)
    else:
        raise AssertionError("AttachedSession without a library did not fail")
    for needle in (why, "STATECACHE_PREBUILT_DATAPLANE_LIB", "STATECACHE_DATAPLANE_LIB",
                   "pip install ./client/python"):
        assert needle in msg, f"{needle!r} not in: {msg}"
