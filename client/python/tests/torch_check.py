"""The torch side of the output contract, against a real statecached. Not
collected by default (torch is not in the CI venv); run it where torch is
installed: bash client/python/run_pytest.sh tests/torch_check.py -- it fails
(never skips) without torch. On a CUDA machine it checks the CUDA device too."""
import numpy as np
import torch

import statecache as sc
from test_live import GEOM, inputs


def test_torch_inputs_give_torch_outputs_on_their_device(client):
    client.register_model("tq", GEOM, "fp32", slots=2, checkpoints=0)
    try:
        slots = client.allocate_slots("tq", 2)
        x = inputs(np.random.default_rng(0), 1)
        want = client.update("tq", 0, slots[:1], *x).o
        assert isinstance(want, np.ndarray)
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for dev in devices:
            t = [torch.from_numpy(a.copy()).to(dev) for a in x]
            client.release_slots("tq", slots[1:])
            slots[1:] = client.allocate_slots("tq", 1)
            o = client.update("tq", 0, slots[1:], *t).o
            assert isinstance(o, torch.Tensor) and o.device.type == dev
            o += 0  # writable
            np.testing.assert_array_equal(o.cpu().numpy(), want)
            with client.update_stream("tq") as s:
                assert s.update(1, slots[1:], *t).o.device.type == dev
        # to_torch accepts numpy outputs (KeyError before) and gives writable tensors
        tt = sc.to_torch(want)
        tt += 1
        assert torch.equal(tt - 1, torch.from_numpy(np.array(want)))
    finally:
        client.drop_model("tq", force=True)
