"""Client-side contracts against a real statecached: argument errors before
any RPC, register_model's required capacities and layout warning, the
UpdateStream in-flight limit, and statecache.aio."""
import asyncio
import threading
import warnings

import numpy as np
import pytest

import statecache as sc
import statecache.aio as sca
from test_live import GEOM, inputs, reference_step


@pytest.fixture(scope="module")
def model(client):
    info = client.register_model("ctr", GEOM, "fp32", slots=8, checkpoints=4)
    yield info
    client.drop_model("ctr", force=True)


@pytest.mark.parametrize("field, bad, want", [
    ("q", "f64", r"q: numpy float64 is not float32"),
    ("k", "i32", r"k: numpy int32 is not float32"),
    ("v", "list", r"v: list is not a numpy array"),
    ("slots", "int", r"slots\[0\]: 5 is not a SlotHandle"),
    ("layer", "str", r"layer: '0' is not an integer"),
    ("model_id", "none", r"model_id: None is not a str"),
])
def test_update_argument_errors_name_the_argument(client, model, field, bad, want):
    rng = np.random.default_rng(0)
    [slot] = client.allocate_slots("ctr", 1)
    try:
        q, k, v, g, beta = inputs(rng, 1)
        args = {"model_id": "ctr", "layer": 0, "slots": [slot], "q": q, "k": k, "v": v,
                "g": g, "beta": beta}
        x = args[field]
        args[field] = {"f64": lambda: np.asarray(x, np.float64),
                       "i32": lambda: np.asarray(x, np.int32), "list": lambda: x.tolist(),
                       "int": lambda: [5], "str": lambda: "0", "none": lambda: None}[bad]()
        with pytest.raises(sc.InvalidArgument, match=want) as e:
            client.update(**args)
        assert e.value.method == "update"
        if field == "model_id":  # None: the stream's own model_id applies
            return
        with pytest.raises(sc.InvalidArgument, match=want):  # the stream checks the same
            with client.update_stream("ctr") as s:
                s.send(*(args[n] for n in ("layer", "slots", "q", "k", "v", "g", "beta")),
                       model_id=args["model_id"])
    finally:
        client.release_slots("ctr", [slot])


def test_other_argument_errors(client, model):
    [slot] = client.allocate_slots("ctr", 1)
    try:
        with pytest.raises(sc.InvalidArgument, match="slot: 3 is not a SlotHandle"):
            client.export_state("ctr", 3)
        with pytest.raises(sc.InvalidArgument, match="count: 0 is below 1"):
            client.allocate_slots("ctr", 0)
        with pytest.raises(sc.InvalidArgument, match="give exactly one of tokens, key"):
            client.snapshot("ctr", slot)
        with pytest.raises(sc.InvalidArgument, match=r"tokens: 4294967296"):
            client.lookup_prefix("ctr", tokens=[1 << 32])
        with pytest.raises(sc.InvalidArgument, match=r"keys\[0\]: 7 is not a PrefixKey"):
            client.lookup_prefix("ctr", keys=[7])
        with pytest.raises(sc.InvalidArgument, match="geometry.arch"):
            client.register_model("x", sc.Geometry("rnn", 1, 1, 1), "fp32", slots=1,
                                  checkpoints=0)
        with pytest.raises(sc.InvalidArgument, match="slots: -1 is below 0"):
            client.register_model("x", GEOM, "fp32", slots=-1, checkpoints=0)
    finally:
        client.release_slots("ctr", [slot])


def test_register_model_requires_capacities(client):
    with pytest.raises(TypeError, match="slots"):
        client.register_model("nocap", GEOM, "fp32")  # would take the whole budget


def test_damp_without_layout_warns_and_layout_file_is_sent(client):
    with pytest.warns(sc.IdentityLayoutWarning, match="identity maps"):
        client.register_model("d1", GEOM, "damp", slots=1, checkpoints=0)
    client.drop_model("d1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # uniform formats have no layout: no warning
        client.register_model("f1", GEOM, "fp16", slots=1, checkpoints=0)
    client.drop_model("f1")
    # a layout file reaches the server (a damaged one is refused, not ignored)
    with pytest.raises(sc.StateCacheError, match="layout_file") as e:
        client.register_model("d2", GEOM, "damp", slots=1, checkpoints=0,
                              layout_file=b"not a layout file")
    assert isinstance(e.value, (sc.InvalidArgument, sc.DataLoss))
    with pytest.raises(sc.InvalidArgument, match="layout_file: cannot read"):
        client.register_model("d2", GEOM, "damp", slots=1, checkpoints=0,
                              layout_file="/nonexistent/x.layout")


def test_calibrate_streams_trajectories(client):
    with pytest.raises(sc.StateCacheError) as e:
        client.calibrate(GEOM, "damp", [b"not safetensors"])
    assert isinstance(e.value, (sc.InvalidArgument, sc.DataLoss)), e.value
    assert e.value.method == "Calibrate"
    with pytest.raises(sc.InvalidArgument, match="trajectories: empty"):
        client.calibrate(GEOM, "damp", [])


def test_stream_in_flight_limit_fails_instead_of_hanging(client, model):
    rng = np.random.default_rng(1)
    slots = client.allocate_slots("ctr", 1)
    S = np.zeros((1, GEOM.h_v, 128, 128), np.float32)
    try:
        with client.update_stream("ctr", max_in_flight=3) as s:
            steps = [inputs(rng, 1) for _ in range(3)]
            for x in steps:
                s.send(0, slots, *x)
            with pytest.raises(sc.ResourceExhausted, match="max_in_flight: 3 requests"):
                s.send(0, slots, *inputs(rng, 1))  # nothing was sent
            for x in steps:
                np.testing.assert_allclose(s.recv().o, reference_step(S, *x),
                                           rtol=1e-4, atol=1e-5)
        with client.update_stream("ctr", max_in_flight=1, send_timeout=0.05) as s:
            s.send(0, slots, *inputs(rng, 1))
            with pytest.raises(sc.ResourceExhausted, match="after waiting 0.05s"):
                s.send(0, slots, *inputs(rng, 1))
            s.recv()
        # a consumer thread frees room: a waiting send() goes through
        with client.update_stream("ctr", max_in_flight=1, send_timeout=None) as s:
            got = []
            t = threading.Thread(target=lambda: got.extend(s.recv().sequence for _ in range(4)))
            t.start()
            assert [s.send(0, slots, *inputs(rng, 1)) for _ in range(4)] == [0, 1, 2, 3]
            t.join(30)
            assert got == [0, 1, 2, 3]
        with pytest.raises(sc.InvalidArgument, match="max_in_flight: 0 is below 1"):
            client.update_stream("ctr", max_in_flight=0)
    finally:
        client.release_slots("ctr", slots)


def test_aio_client_same_methods_results_and_errors(server, client, model):
    rng = np.random.default_rng(2)
    steps = [inputs(rng, 2) for _ in range(3)]
    S = np.zeros((2, GEOM.h_v, 128, 128), np.float32)
    want = [reference_step(S, *x) for x in steps]

    async def main():
        async with sca.Client(server.target, timeout=30) as c:
            await c.wait_ready(10)
            assert await c.health()
            assert (await c.describe_model("ctr")) == client.describe_model("ctr")
            slots = await c.allocate_slots("ctr", 2)
            o = (await c.update("ctr", 0, slots, *steps[0])).o
            np.testing.assert_allclose(o, want[0], rtol=1e-4, atol=1e-5)
            async with c.update_stream("ctr", max_in_flight=2) as s:
                seqs = [await s.send(0, slots, *x) for x in steps[1:]]
                with pytest.raises(sc.ResourceExhausted, match="max_in_flight: 2"):
                    await s.send(0, slots, *steps[0])
                for seq, w in zip(seqs, want[1:]):
                    r = await s.recv()
                    assert r.sequence == seq
                    np.testing.assert_allclose(r.o, w, rtol=1e-4, atol=1e-5)
                with pytest.raises(sc.InvalidArgument, match=r"UpdateStream\[seq=2\].*layer"):
                    await s.update(9, slots, *steps[0])
            key = (await c.snapshot("ctr", slots[0], tokens=[1, 2, 3])).key
            assert key == sc.prefix_hash([1, 2, 3])
            hit = await c.lookup_prefix("ctr", keys=sc.prefix_keys([1, 2, 3, 4]))
            assert hit.hit and hit.key == key
            r = await c.restore("ctr", slots[1], hit.key, hit.lease_id)
            assert r.num_tokens == 3
            with pytest.raises(sc.NotFound):
                await c.describe_model("nope")
            with pytest.raises(sc.InvalidArgument, match=r"slots\[0\]"):
                await c.update("ctr", 0, [1], *steps[0])
            assert (await c.get_stats("ctr")).model("ctr") is not None
            await c.release_slots("ctr", slots)

    asyncio.run(main())


def test_public_methods_have_hints_and_docstrings():
    import inspect
    import typing
    for cls in (sc.Client, sca.Client, sc.UpdateStream, sca.UpdateStream, sc.ShardedClient):
        for name, f in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            assert f.__doc__, f"{cls.__module__}.{cls.__name__}.{name}: no docstring"
            hints = typing.get_type_hints(f)
            params = [p for p in inspect.signature(f).parameters.values()
                      if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            missing = [p.name for p in params if p.name not in hints] + \
                      ([] if "return" in hints else ["return"])
            assert not missing, f"{cls.__name__}.{name}: no hints for {missing}"
    import os
    assert os.path.isfile(os.path.join(os.path.dirname(sc.__file__), "py.typed"))
