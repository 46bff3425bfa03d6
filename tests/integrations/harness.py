"""Shared set-up of the GPU scripts of statecache.integrations (issue 27):
paths of the staged bundle (tests/integrations/stage_device.sh), a
statecached child on the CUDA backend, PASS / FAIL / RESULT lines."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

# PASS / FAIL / INFO lines and raise checks: the shared harness of the GPU
# checks (tests/dataplane/torch_attached_check.py; standard library only).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dataplane"))
import torch_attached_check as _tac  # noqa: E402

report, info, expect = _tac.report, _tac.info, _tac.expect


def finish(name: str) -> int:
    failed = sum(1 for _, ok in _tac._results if not ok)
    print(f"RESULT {name}: {'PASS' if failed == 0 and _tac._results else 'FAIL'} "
          f"({len(_tac._results)} checks, {failed} failed)", flush=True)
    return 0 if failed == 0 and _tac._results else 1


def setup_paths(bundle: str) -> None:
    """sys.path / env for the staged package (with its generated stubs) and library."""
    sys.path.insert(0, os.path.join(bundle, "python"))
    os.environ.setdefault("STATECACHE_DATAPLANE_LIB",
                          os.path.join(bundle, "lib", "libstatecache_dataplane.so"))
    prefix = os.path.join(bundle, "lib", "libstatecache_prefix.so")
    if os.path.exists(prefix):
        os.environ.setdefault("STATECACHE_PREFIX_LIB", prefix)


class Server:
    """statecached --backend=cuda on 127.0.0.1 (ephemeral port), stopped by stop()."""

    def __init__(self, binary: str, state_bytes: int, checkpoint_bytes: int, extra=()):
        self.log = []
        self.port = 0
        ready = threading.Event()
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", "--metrics_port=-1", "--backend=cuda",
             f"--state_memory_bytes={state_bytes}", f"--checkpoint_memory_bytes={checkpoint_bytes}",
             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"server_started .* port=(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(120) or not self.port:
            self.stop()
            raise RuntimeError("statecached did not start:\n" + "".join(self.log[-40:]))

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
