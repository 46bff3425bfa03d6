"""statecache.torch from a `pip install ./client/python` (pip_install_e2e.sh):
python torch_smoke.py STATECACHED VENV. Checks that statecache imports from
VENV, that find_library picks the library pip bundled, and that one decode op
(sct.decode on an EnginePool, CPU backend, fp32 GDN) against a real
statecached returns the closed-form o, bit-identical to the server-side
update of the same step on a twin slot, with a clean error record."""
import os
import sys

import torch

import statecache as sc
import statecache.torch as sct

import installed


def main(binary, venv):
    where = os.path.realpath(sc.__file__)
    assert where.startswith(os.path.realpath(venv) + os.sep), f"statecache from {where}"
    lib = installed.bundled_library()
    proc, target = installed.start_statecached(binary)
    try:
        q, v, g, beta, want = (torch.from_numpy(x) for x in installed.step_inputs())
        with sc.Client(target, timeout=30) as c:
            c.wait_ready(10)
            c.register_model("m", installed.GEOM, "fp32", slots=4, checkpoints=2)
            [served, mine] = c.allocate_slots("m", 2)
            o_served = c.update("m", 0, [served], q, q, v, g, beta).o
            with sct.EnginePool(target, "m", [mine]) as pool:
                assert not pool.cuda and pool.device == torch.device("cpu"), pool.device
                slots = pool.slot_indices([mine])
                record = pool.new_record()
                o = sct.decode(pool, 0, slots, q, q, v, g, beta, record=record)
                pool.check(record)
    finally:
        installed.stop(proc)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(o, o_served), (o - o_served).abs().max()
    print(f"torch_smoke ok: statecache {where}, torch {torch.__version__}, library {lib}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
