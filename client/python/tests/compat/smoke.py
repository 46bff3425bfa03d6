"""Smoke call of an installed statecache (tests/compat/install_test.sh):
python smoke.py STATECACHED PINS.txt. Checks that the runtime versions are
the pinned ones, that statecache imports from site-packages (not the
source tree), and that a register / update / snapshot / lookup round trip
against a real statecached works, sync and asyncio."""
import asyncio
import os
import re
import subprocess
import sys

import google.protobuf
import grpc
import numpy as np

import statecache as sc
import statecache.aio as sca


def main(binary, pins_file):
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)", open(pins_file).read(), re.M))
    assert google.protobuf.__version__ == pins["protobuf"], google.protobuf.__version__
    assert grpc.__version__ == pins["grpcio"], grpc.__version__
    assert "site-packages" in sc.__file__, sc.__file__
    assert sc.prefix.NATIVE, "the wheel's C prefix chain did not load"
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--metrics_port=-1",
                             "--backend=cpu", f"--state_memory_bytes={16 << 20}",
                             f"--checkpoint_memory_bytes={4 << 20}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"server_started .* port=(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "statecached did not start"
        target = f"127.0.0.1:{port}"
        geom = sc.Geometry("gdn", layers=1, h_qk=1, h_v=2, d_k=128, d_v=128)
        rng = np.random.default_rng(0)
        q = rng.standard_normal((1, 1, 128)).astype(np.float32)
        q /= np.linalg.norm(q)
        v = rng.standard_normal((1, 2, 128)).astype(np.float32)
        g = np.full((1, 2), -0.1, np.float32)
        beta = np.full((1, 2), 0.5, np.float32)
        with sc.Client(target, timeout=30) as c:
            c.wait_ready(10)
            assert c.health()
            c.register_model("m", geom, "fp32", slots=2, checkpoints=2)
            [slot] = c.allocate_slots("m", 1)
            o = c.update("m", 0, [slot], q, q, v, g, beta).o
            # S = beta k (v)^T from zero: o = S^T q / sqrt(d_k) = 0.5 v (q.q) / sqrt(128)
            np.testing.assert_allclose(o, 0.5 * v / np.sqrt(128), rtol=1e-5, atol=1e-6)
            key = c.snapshot("m", slot, tokens=[1, 2, 3]).key
            assert key == sc.prefix_hash([1, 2, 3])
            try:
                c.describe_model("nope")
                raise AssertionError("describe_model('nope') did not fail")
            except sc.NotFound:
                pass

        async def aio():
            async with sca.Client(target, timeout=30) as c:
                hit = await c.lookup_prefix("m", tokens=[1, 2, 3, 4])
                assert hit.hit and hit.key == key

        asyncio.run(aio())
    finally:
        proc.terminate()
        proc.wait(15)
    print(f"smoke ok: protobuf {google.protobuf.__version__}, grpcio {grpc.__version__}, "
          f"numpy {np.__version__}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
