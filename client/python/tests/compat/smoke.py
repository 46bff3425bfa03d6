"""Smoke call of an installed statecache (tests/compat/install_test.sh):
python smoke.py STATECACHED PINS.txt NATIVE. Checks that the runtime versions
are the pinned ones, that statecache imports from site-packages (not the
source tree), and that a register / update / snapshot / lookup round trip
against a real statecached works, sync and asyncio. NATIVE "bundled": the
wheel's statecache/_native/libstatecache_dataplane.so is what find_library
picks and an attached decode_update (numpy, CPU backend) returns the
closed-form o, equal to the server-side update's; "absent:WHY": the wheel
has no library and AttachedSession says WHY and how to get one."""
import asyncio
import re
import sys

import google.protobuf
import grpc
import numpy as np

import statecache as sc
import statecache.aio as sca
from statecache.attached import AttachedSession

import installed


def main(binary, pins_file, native):
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)", open(pins_file).read(), re.M))
    assert google.protobuf.__version__ == pins["protobuf"], google.protobuf.__version__
    assert grpc.__version__ == pins["grpcio"], grpc.__version__
    assert "site-packages" in sc.__file__, sc.__file__
    assert sc.prefix.NATIVE, "the wheel's C prefix chain did not load"
    if native.startswith("absent:"):
        installed.assert_no_library(native[len("absent:"):])
    else:
        assert native == "bundled", native
        installed.bundled_library()
    proc, target = installed.start_statecached(binary)
    try:
        q, v, g, beta, want = installed.step_inputs()
        with sc.Client(target, timeout=30) as c:
            c.wait_ready(10)
            assert c.health()
            c.register_model("m", installed.GEOM, "fp32", slots=4, checkpoints=2)
            [slot, mine] = c.allocate_slots("m", 2)
            o = c.update("m", 0, [slot], q, q, v, g, beta).o
            np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
            key = c.snapshot("m", slot, tokens=[1, 2, 3]).key
            assert key == sc.prefix_hash([1, 2, 3])
            try:
                c.describe_model("nope")
                raise AssertionError("describe_model('nope') did not fail")
            except sc.NotFound:
                pass
            if native == "bundled":  # the same step in this process, on `mine`
                o_att = np.zeros_like(o)
                with AttachedSession(target, "m", [mine]) as a:
                    a.decode_update(0, q, q, v, g, beta, o_att)
                np.testing.assert_array_equal(o_att, o)

        async def aio():
            async with sca.Client(target, timeout=30) as c:
                hit = await c.lookup_prefix("m", tokens=[1, 2, 3, 4])
                assert hit.hit and hit.key == key

        asyncio.run(aio())
    finally:
        installed.stop(proc)
    print(f"smoke ok: protobuf {google.protobuf.__version__}, grpcio {grpc.__version__}, "
          f"numpy {np.__version__}, library {native}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
