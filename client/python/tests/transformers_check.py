"""statecache.integrations.transformers against a real statecached (CPU
backend, --shared_pools) with tiny Qwen3-Next / Qwen3.5 models built from a
config (no downloads; saved with save_pretrained and loaded back). Not
collected by default (transformers and torch are not in the CI venv): run by
//client/python:transformers_check_test in the torch venv, where it fails
(never skips) without them:

    bash client/python/run_torch_pytest.sh tests/transformers_check.py

- fp32 states: greedy generate token for token equal to stock transformers
  (both prefill paths, a left-padded batch, Qwen3-Next, Qwen3.5 dense and
  MoE), the slots' states equal to the stock cache's final states;
- damp:16 calibrated from the model's own forward (trajectory hooks +
  Calibrate RPC): runs, states within DAMP's error of FP32 (a key
  permutation applied inconsistently would scramble them);
- multi-turn: end_turn / begin_turn (Snapshot with conv windows as aux,
  LookupPrefix, Restore, prefill of the new tokens only) equal to an
  uninterrupted run, in fp32 and damp:16;
- bad input: a named InvalidArgument and nothing changed;
- the README's transformers example, run as printed.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import statecache as sc
from conftest import PKG_ROOT, REPO, Server

import transformers  # noqa: E402  (fails, never skips, without it)
from statecache.integrations import transformers as sch  # noqa: E402

torch.set_num_threads(1)
MAX_NEW = 6


def tiny_config(cls_name="Qwen3NextConfig", **kw):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                layer_types=["linear_attention", "linear_attention", "full_attention",
                             "linear_attention"],
                num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=512,
                initializer_range=0.15, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    if cls_name in ("Qwen3NextConfig", "Qwen3_5MoeTextConfig"):
        base.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=32)
    base.update(kw)
    return getattr(transformers, cls_name)(**base)


def build(tmp_path_factory, cfg, model_cls):
    torch.manual_seed(0)
    m = getattr(transformers, model_cls)(cfg)
    d = tmp_path_factory.mktemp(model_cls)
    m.save_pretrained(d)
    return getattr(transformers, model_cls).from_pretrained(d, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build(tmp_path_factory, tiny_config(), "Qwen3NextForCausalLM")


@pytest.fixture(scope="module")
def shared_server(statecached_binary):
    s = Server(statecached_binary, ("--shared_pools", f"--state_memory_bytes={96 << 20}",
                                    f"--checkpoint_memory_bytes={64 << 20}"))
    yield s
    rc = s.stop()
    assert rc == 0, "statecached exited with %r:\n%s" % (rc, "".join(s.log))


@pytest.fixture(scope="module")
def client(shared_server):
    c = sc.Client(shared_server.target, timeout=60)
    c.wait_ready(10)
    yield c
    c.close()


_ids = iter(range(1000))


def register(client, model, fmt="fp32", slots=4, checkpoints=8, **kw):
    return sch.register_model(client, f"m{next(_ids)}", model, fmt, slots=slots,
                              checkpoints=checkpoints, **kw)


def prompt(batch=2, length=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (batch, length), generator=g)


def greedy(model, ids, cache=None, mask=None, n=MAX_NEW):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, past_key_values=cache,
                              max_new_tokens=n, do_sample=False)


def stock_states(model, ids, mask=None):
    """Greedy generate with the stock cache; (tokens, its final GDN states
    [B, layers, h_v, d_k, d_v])."""
    cache = transformers.DynamicCache(config=model.config)
    out = greedy(model, ids, cache, mask)
    gdn = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
    return out, torch.stack([cache.layers[i].recurrent_states[0] for i in gdn], 1)


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


# ---- fp32: token for token the stock runtime ------------------------------------------

@pytest.mark.parametrize("prefill", ["statecache", "runtime"])
def test_fp32_generate_equals_stock(client, model, prefill):
    ids = prompt()
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # row 1 left-padded
    want, want_states = stock_states(model, ids, mask)
    states = register(client, model)
    with sch.StatecacheCache(model, states, batch_size=2, prefill=prefill) as cache:
        got = greedy(model, ids, cache, mask)
        assert torch.equal(got, want), (got, want)
        # the recurrence ran in statecache: prompt prefilled, MAX_NEW - 1 decode steps
        assert cache.stats["prefill_tokens"] == 2 * ids.shape[1]
        assert cache.stats["decode_tokens"] == 2 * (MAX_NEW - 1)
        s = cache.read_states()
        assert s.shape == want_states.shape
        assert rel_err(s, want_states) < 1e-5, rel_err(s, want_states)
    client.drop_model(states.model_id)


@pytest.mark.parametrize("cfg_name,model_cls", [("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
                                                ("Qwen3_5MoeTextConfig",
                                                 "Qwen3_5MoeForCausalLM")])
def test_qwen3_5_classes(client, tmp_path_factory, cfg_name, model_cls):
    m = build(tmp_path_factory, tiny_config(cfg_name), model_cls)
    ids = prompt(batch=1, seed=3)
    want, _ = stock_states(m, ids)
    states = register(client, m)
    with sch.StatecacheCache(m, states, batch_size=1) as cache:
        assert torch.equal(greedy(m, ids, cache), want)
        assert cache.stats["decode_tokens"] == MAX_NEW - 1
    client.drop_model(states.model_id)


# ---- damp:16 calibrated inside the runtime -----------------------------------------------

@pytest.fixture(scope="module")
def damp_states(client, model):
    g = torch.Generator().manual_seed(11)
    docs = [torch.randint(1, 256, (48,), generator=g) for _ in range(6)]
    states, result = sch.calibrate(client, model, docs, "damp-cal", "damp:16", slots=4,
                                   checkpoints=8)
    return states, result


def test_damp16_calibrated_layout(client, model, damp_states, tmp_path):
    states, result = damp_states
    assert result.model is not None and result.model.format.startswith("damp")
    assert result.tokens == 6 * 48
    perm = sch_perm(result.layout_file)
    geo = states.geometry
    assert tuple(perm.shape) == (geo.layers, geo.h_v, geo.d_k)
    ident = torch.arange(geo.d_k, dtype=perm.dtype).expand_as(perm)
    assert not torch.equal(perm, ident), "calibration kept the identity: nothing is checked"
    # the recorded files are what the trajectory reader accepts (q / k unit rows)
    [path] = sch.record_trajectories(model, [prompt(1, 16)[0]], str(tmp_path))
    from safetensors.torch import load_file
    t = load_file(path)
    assert t["layer0.q"].shape == (16, geo.h_qk, geo.d_k)
    torch.testing.assert_close(t["layer0.k"].norm(dim=-1), torch.ones(16, geo.h_qk))
    ids = prompt()
    want, want_states = stock_states(model, ids)
    with sch.StatecacheCache(model, states, batch_size=2) as cache:
        got = greedy(model, ids, cache)
        s = cache.read_states()
    assert got.shape == want.shape
    agree = float((got[:, ids.shape[1]:] == want[:, ids.shape[1]:]).float().mean())
    print(f"damp:16 greedy agreement with fp32 stock: {agree:.3f}")
    # DAMP's error on these states is ~1e-3; a permutation applied to the
    # state but not to q / k (or the other way) gives ~1.
    err = rel_err(s, want_states)
    print(f"damp:16 state rel. error vs fp32 stock: {err:.2e}")
    assert err < 2e-2, err
    info = client.describe_model(states.model_id)
    assert info.slot_bytes < info.fp32_slot_bytes / 2, (info.slot_bytes, info.fp32_slot_bytes)


def sch_perm(layout_file):
    from statecache.integrations._slots import layout_key_perm
    return layout_key_perm(layout_file)


# ---- multi-turn prefix reuse ------------------------------------------------------------

def turns(model, cache, interrupt, user_turns):
    """Greedy turns; with interrupt, end_turn / begin_turn between them."""
    ids, outs, restored = user_turns[0], [], []
    for n, user in enumerate(user_turns):
        if n:
            ids = torch.cat([outs[-1], user], 1)
            if interrupt:
                restored.append(cache.begin_turn(ids))
        outs.append(greedy(model, ids, cache))
        if interrupt and n + 1 < len(user_turns):
            keys = cache.end_turn(outs[-1])
            assert keys[0].num_tokens == outs[-1].shape[1] - 1
    return outs, restored


@pytest.mark.parametrize("fmt", ["fp32", "damp"])
def test_multi_turn_restore_equals_uninterrupted(client, model, damp_states, fmt):
    users = [prompt(1, 9, seed=5), prompt(1, 4, seed=6), prompt(1, 5, seed=7)]
    states = register(client, model) if fmt == "fp32" else damp_states[0]
    with sch.StatecacheCache(model, states, batch_size=1) as a:
        straight, _ = turns(model, a, False, users)
    before = restores(client, states.model_id)
    with sch.StatecacheCache(model, states, batch_size=1) as b:
        resumed, restored = turns(model, b, True, users)
        # only the new tokens were prefilled: turn n restored everything before
        # its last generated token
        assert restored == [straight[0].shape[1] - 1, straight[1].shape[1] - 1]
        assert b.stats["restored_tokens"] == sum(restored)
        assert b.stats["prefill_tokens"] == users[0].shape[1] + 1 + users[1].shape[1] + \
            1 + users[2].shape[1], b.stats
    for s, r in zip(straight, resumed):
        assert torch.equal(s, r), (s, r)
    if fmt == "fp32":  # and the stock runtime's multi-turn run
        cache = transformers.DynamicCache(config=model.config)
        stock, _ = turns(model, cache, False, users)
        for s, r in zip(stock, straight):
            assert torch.equal(s, r)
    assert restores(client, states.model_id) - before == 2


def restores(client, model_id):
    return client.get_stats(model_id).model(model_id).stats.restores


def test_begin_turn_without_checkpoint_starts_fresh(client, model):
    states = register(client, model)
    ids = prompt(1, 8, seed=9)
    want = greedy(model, ids)
    with sch.StatecacheCache(model, states, batch_size=1) as cache:
        greedy(model, prompt(1, 8, seed=10), cache)
        cache.end_turn(prompt(1, 8 + MAX_NEW, seed=12))  # another conversation's tokens
        assert cache.begin_turn(ids) == 0  # the lookup misses: zero state, empty KV
        assert cache.get_seq_length() == 0
        assert torch.equal(greedy(model, ids, cache), want)
    client.drop_model(states.model_id)


# ---- bad input: a named exception, nothing changed ------------------------------------------

def expect(exc, needle, fn):
    with pytest.raises(exc) as e:
        fn()
    assert needle in e.value.message, e.value.message
    return e.value


def test_bad_input_names_the_argument(client, model):
    states = register(client, model, slots=2)
    with sch.StatecacheCache(model, states, batch_size=2) as cache:
        greedy(model, prompt(), cache, n=2)
        before = cache.read_states().clone()
        windows = [cache.layers[i].conv_states[0].clone() for i in cache._gdn]
        kv = cache.get_seq_length()

        def unchanged():
            assert torch.equal(cache.read_states(), before)
            for i, w in zip(cache._gdn, windows):
                assert torch.equal(cache.layers[i].conv_states[0], w)
            assert cache.get_seq_length() == kv

        # more sequences than slots
        expect(sc.InvalidArgument, "input_ids: 3 sequences; this StatecacheCache holds 2",
               lambda: greedy(model, prompt(batch=3), cache, n=2))
        unchanged()
        # a model in a dtype the cache was not made for (and the ops do not take)
        m64 = type(model)(model.config).eval()
        m64.load_state_dict(model.state_dict())
        m64 = m64.double()
        expect(sc.InvalidArgument, "hidden_states: dtype torch.float64",
               lambda: greedy(m64, prompt().clone(), cache, n=2))
        unchanged()
        # states written by the user: dtype, contiguity, shape
        expect(sc.InvalidArgument, "states: dtype torch.bfloat16",
               lambda: cache.write_states(before.to(torch.bfloat16)))
        expect(sc.InvalidArgument, "states: not contiguous",
               lambda: cache.write_states(before.transpose(3, 4).contiguous().transpose(3, 4)))
        expect(sc.InvalidArgument, "states: shape",
               lambda: cache.write_states(before[:1]))
        unchanged()
        # the runtime-tensor checks of the shared half (what the hooks call)
        geo = states.geometry
        x = torch.randn(2, 1, geo.h_v, geo.d_k)
        v = torch.randn(2, 1, geo.h_v, geo.d_v)
        g, beta = -torch.rand(2, 1, geo.h_v), torch.rand(2, 1, geo.h_v)
        b = cache._batch
        expect(sc.InvalidArgument, "query: dtype torch.float64",
               lambda: b.op_inputs(x.double(), x, v, g, beta))
        expect(sc.InvalidArgument, "value: on meta; this cache's slots are on cpu",
               lambda: b.op_inputs(x, x, v.to("meta"), g, beta))
        expect(sc.InvalidArgument, "key: 3 sequences; this cache holds 2 slots",
               lambda: b.op_inputs(x, torch.randn(3, 1, geo.h_v, geo.d_k), v, g, beta))
        unchanged()
        # values the ops reject on the device side (NaN) are recorded, named, and write nothing
        q, k, vv, gg, bb = b.op_inputs(x, x, v, g, beta)
        vv[1, 0, 0, 0] = float("nan")
        b.decode(0, q, k, vv, gg, bb)
        expect(sc.InvalidArgument, "decode layer 0: v[", b.check)
        unchanged()
    # a model of another dtype / a geometry that does not match / too many rows
    expect(sc.InvalidArgument, "model: dtype torch.float64",
           lambda: sch.StatecacheCache(m64, states, batch_size=1))
    other = sch.ModelStates(client, states.model_id, sc.Geometry("gdn", 3, 2, 4, 32, 64))
    expect(sc.InvalidArgument, "states: geometry",
           lambda: sch.StatecacheCache(model, other, batch_size=1))
    expect(sc.InvalidArgument, "batch_size: 0",
           lambda: sch.StatecacheCache(model, states, batch_size=0))
    e = expect(sc.ResourceExhausted, "", lambda: sch.StatecacheCache(model, states, batch_size=3))
    print("batch_size beyond the model's slots:", e)
    client.drop_model(states.model_id)


# ---- the README's example, as printed ------------------------------------------------------

def readme_blocks(path, marker):
    text = open(path).read()
    return re.findall(r"<!-- " + re.escape(marker) + r" -->\n```python\n(.*?)```", text, re.S)


RUN_BY = "run by: tests/transformers_check.py"


@pytest.mark.parametrize("readme", ["client/python/README.md", "README.md"])
def test_readme_example_runs_as_printed(shared_server, readme):
    blocks = readme_blocks(os.path.join(REPO, readme), RUN_BY)
    assert len(blocks) == 1, f"{readme}: want one block marked <!-- {RUN_BY} -->"
    import statecache
    prelude = "import statecache\nstatecache.__path__.extend(%r)\n" % list(statecache.__path__)
    env = dict(os.environ, STATECACHE_SERVER=shared_server.target,
               PYTHONPATH=os.pathsep.join([PKG_ROOT] + [p for p in sys.path if p]))
    r = subprocess.run([sys.executable, "-c", prelude + blocks[0]], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{readme}:\n{blocks[0]}\n--- stdout:\n{r.stdout}\n" \
                              f"--- stderr:\n{r.stderr}"
    assert "identical to stock transformers: True" in r.stdout, r.stdout


def test_numpy_is_importable():  # the venv is the torch one (numpy 2 + torch)
    assert np.__version__ and torch.__version__
