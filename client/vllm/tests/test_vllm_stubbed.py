"""The vLLM-facing classes with vLLM stubbed: the few names vllm_gdn.py,
vllm_models.py and register() import are replaced by small fakes (conv
kernels = identity), and the layers run two vLLM steps (varlen prefill, then
decode) of two KV-cache groups on a real statecached (CPU backend), against
the float64 reference. What this checks: the state shape / dtype vLLM sees,
the pool's layer positions from shared tensors, block id -> slot lookup per
group, the builder's prefill grid and fresh flags, the layer's token slicing,
and the plugin's registration."""
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from gdn_reference import l2n, token

H_QK, H_V, D = 2, 4, 128
CONV_DIM = 2 * H_QK * D + H_V * D


# ---- the stubs ----------------------------------------------------------------

class FakeGDN(torch.nn.Module):
    """Stands in for vLLM's QwenGatedDeltaNetAttention (attributes the plugin reads)."""
    name = "qwen_gated_delta_net_attention"
    oot = {}

    def __init__(self, config, vllm_config, prefix="", gqa_interleaved_layout=False,
                 reduce_results=True):
        super().__init__()
        self.prefix, self.tp_size, self.tp_rank = prefix, 1, 0
        self.layer_idx = int(prefix.split(".")[2])
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim = self.head_v_dim = D
        self.activation = "silu"
        self.conv1d = types.SimpleNamespace(weight=torch.zeros(CONV_DIM, 1, 4), bias=None)
        gen = torch.Generator().manual_seed(self.layer_idx)
        self.A_log = 0.3 * torch.randn(H_V, generator=gen)
        self.dt_bias = 0.3 * torch.randn(H_V, generator=gen)

    def get_state_shape(self):
        return (3, CONV_DIM), (H_V, D, D)

    @staticmethod
    def chunk_gated_delta_rule(q, k, v, g, beta, initial_state, output_final_state,
                               use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                               chunk_offsets):
        """vLLM's ChunkGatedDeltaRule as the float64 reference: varlen rows of
        cu_seqlens, value-first states [P, h_v, d_v, d_k], q / k normalized."""
        assert output_final_state and not use_qk_l2norm_in_kernel
        o = torch.zeros(v.shape, dtype=torch.float32)
        final = torch.empty(initial_state.shape, dtype=torch.float32)
        for r in range(cu_seqlens.numel() - 1):
            S = initial_state[r].double().transpose(-1, -2)
            for t in range(int(cu_seqlens[r]), int(cu_seqlens[r + 1])):
                out, S = token(S, q[0, t], k[0, t], v[0, t], g[0, t], beta[0, t])
                o[0, t] = out.float()
            final[r] = S.transpose(-1, -2).float()
        return o, final

    def get_state_dtype(self):
        return torch.bfloat16, torch.float32

    def get_attn_backend(self):
        return "stock-backend"

    def _forward_core(self, mixed_qkv, b, a, core_attn_out):
        raise AssertionError("stock _forward_core")

    @classmethod
    def register_oot(cls, layer_cls):
        FakeGDN.oot["QwenGatedDeltaNetAttention"] = layer_cls
        return layer_cls


class FakeBuilder:
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        self.vllm_config, self.decode_cudagraph_max_bs = vllm_config, 8

    def build(self, common_prefix_len, m, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, fast_build=False):
        return m.stock

    def build_for_cudagraph_capture(self, m):
        return self.build(0, m)


def fake_post_conv_prep(conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim,
                        apply_l2norm, output_g_exp):
    kd = num_k_heads * head_k_dim
    n = conv_output.shape[0]
    q = l2n(conv_output[:, :kd].reshape(n, num_k_heads, head_k_dim)).float()
    k = l2n(conv_output[:, kd:2 * kd].reshape(n, num_k_heads, head_k_dim)).float()
    v = conv_output[:, 2 * kd:].reshape(n, -1, head_v_dim).contiguous()
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return q, k, v, g, torch.sigmoid(b.float())


class FakeRegistry:
    def __init__(self):
        self.models = {}

    def register_model(self, arch, path):
        self.models[arch] = path


class StockModel:
    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        return (3, CONV_DIM), (H_V, D, D)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        return torch.bfloat16, torch.float32


FORWARD = types.SimpleNamespace(attn_metadata=None)


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


@pytest.fixture
def plugin(monkeypatch):
    """Installs the stubs, yields the freshly imported plugin modules."""
    registry = FakeRegistry()
    FakeGDN.oot.clear()
    stubs = {
        "vllm": _module("vllm", __version__="0.26.0", ModelRegistry=registry),
        "vllm.logger": _module("vllm.logger", init_logger=lambda n: types.SimpleNamespace(
            info=lambda *a, **k: None)),
        "vllm.model_executor": _module("vllm.model_executor"),
        "vllm.model_executor.custom_op": _module("vllm.model_executor.custom_op",
                                                 op_registry_oot=FakeGDN.oot),
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn": _module(
            "q", QwenGatedDeltaNetAttention=FakeGDN),
        "vllm.model_executor.layers.mamba.mamba_utils": _module(
            "mu", is_conv_state_dim_first=lambda: False),
        "vllm.model_executor.layers.mamba.ops.causal_conv1d": _module(
            "cc", causal_conv1d_fn=lambda x, *a, **k: x,
            causal_conv1d_update=lambda x, *a, **k: x),
        "vllm.platforms": _module("p", current_platform=types.SimpleNamespace(
            is_cuda=lambda: True)),
        "vllm.third_party.flash_linear_attention.ops": _module(
            "fla", fused_post_conv_prep=fake_post_conv_prep),
        "vllm.v1.attention.backends.gdn_attn": _module(
            "ga", GDNAttentionBackend=type("GDNAttentionBackend", (), {}),
            GDNAttentionMetadataBuilder=FakeBuilder),
        "vllm.forward_context": _module("fc", get_forward_context=lambda: FORWARD),
        "vllm.model_executor.models.qwen3_next": _module(
            "qn", Qwen3NextForCausalLM=type("Qwen3NextForCausalLM", (StockModel,), {})),
        "vllm.model_executor.models.qwen3_5": _module(
            "q5", Qwen3_5ForConditionalGeneration=type("A", (StockModel,), {}),
            Qwen3_5MoeForConditionalGeneration=type("B", (StockModel,), {})),
    }
    for name, mod in stubs.items():
        monkeypatch.setitem(sys.modules, name, mod)
    for name in [n for n in sys.modules if n.startswith("statecache_vllm")]:
        monkeypatch.delitem(sys.modules, name)
    import statecache_vllm
    import statecache_vllm.vllm_gdn as gdn
    import statecache_vllm.vllm_models as models
    yield types.SimpleNamespace(pkg=statecache_vllm, gdn=gdn, models=models, registry=registry)
    if gdn._REGISTRY.pm is not None:
        gdn._REGISTRY.pm.close()


def vllm_config(sc=None, **cache):
    return types.SimpleNamespace(
        additional_config={} if sc is None else {"statecache": sc},
        cache_config=types.SimpleNamespace(**{"mamba_cache_mode": "none",
                                              "enable_prefix_caching": False, **cache}),
        speculative_config=None, scheduler_config=types.SimpleNamespace(max_num_seqs=8),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
        model_config=types.SimpleNamespace(hf_text_config=HF),
        compilation_config=types.SimpleNamespace(static_forward_context={}))


HF = types.SimpleNamespace(linear_num_key_heads=H_QK, linear_num_value_heads=H_V,
                           linear_key_head_dim=D, linear_value_head_dim=D)


# ---- tests ----------------------------------------------------------------------

def test_register(plugin):
    plugin.pkg.register()
    assert FakeGDN.oot["QwenGatedDeltaNetAttention"] is plugin.gdn.StatecacheGDNAttention
    assert plugin.registry.models == plugin.pkg.ARCHITECTURES
    plugin.pkg.register()  # idempotent


def test_register_refuses_other_vllm(plugin, monkeypatch):
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.27.1")
    with pytest.raises(RuntimeError, match="pinned to vllm==0.26.0; found 0.27.1"):
        plugin.pkg.register()


def test_inactive_is_stock(plugin, monkeypatch):
    monkeypatch.delenv("STATECACHE_VLLM", raising=False)
    layer = plugin.gdn.StatecacheGDNAttention(HF, vllm_config(), "model.layers.0.linear_attn")
    assert layer.get_state_shape() == ((3, CONV_DIM), (H_V, D, D))
    assert layer.get_state_dtype() == (torch.bfloat16, torch.float32)
    assert layer.get_attn_backend() == "stock-backend"
    with pytest.raises(AssertionError, match="stock _forward_core"):
        layer._forward_core(None, None, None, None)
    m = plugin.models.StatecacheQwen3NextForCausalLM
    assert m.get_mamba_state_shape_from_config(vllm_config()) == ((3, CONV_DIM), (H_V, D, D))


def test_packed_state_declared(plugin):
    cfg = vllm_config({"format": "damp:16"})
    layer = plugin.gdn.StatecacheGDNAttention(HF, cfg, "model.layers.0.linear_attn")
    assert layer.get_state_shape() == ((3, CONV_DIM), (H_V * 20224,))
    assert layer.get_state_dtype() == (torch.bfloat16, torch.uint8)
    assert layer.get_attn_backend() is plugin.gdn.StatecacheGDNBackend
    assert plugin.gdn.StatecacheGDNBackend.get_builder_cls() is \
        plugin.gdn.StatecacheGDNMetadataBuilder
    for cls in (plugin.models.StatecacheQwen3NextForCausalLM,
                plugin.models.StatecacheQwen3_5MoeForConditionalGeneration):
        assert cls.get_mamba_state_shape_from_config(cfg) == layer.get_state_shape()
        assert cls.get_mamba_state_dtype_from_config(cfg) == layer.get_state_dtype()


@pytest.mark.parametrize("sc,cache,needle", [
    ({"storage": "server"}, {"enable_prefix_caching": True}, "enable_prefix"),
    ({"storage": "server"}, {"mamba_cache_mode": "align"}, "enable_prefix"),
    ({}, {"enable_prefix_caching": True, "mamba_cache_mode": "all"}, "mamba_cache_mode: 'all'")])
def test_unsupported_settings(plugin, sc, cache, needle):
    from statecache_vllm.config import ConfigError
    with pytest.raises(ConfigError, match=needle):
        plugin.gdn.StatecacheGDNAttention(HF, vllm_config(sc, **cache), "model.layers.0.x")
    # "pages" serves prefix caching in 'align' mode
    plugin.gdn.StatecacheGDNAttention(
        HF, vllm_config({}, enable_prefix_caching=True, mamba_cache_mode="align"),
        "model.layers.0.x")
    cfg = vllm_config({})
    cfg.speculative_config = object()
    with pytest.raises(ConfigError, match="speculative_config"):
        plugin.gdn.StatecacheGDNAttention(HF, cfg, "model.layers.0.x")


def _metadata(nd, qsl, blocks, computed, has_init):
    """vLLM's GDN metadata of a step (decodes first), as the stub builder returns it."""
    qsl = torch.tensor(qsl, dtype=torch.int32)
    npf = len(blocks) - nd
    stock = types.SimpleNamespace(
        num_decodes=nd, num_decode_tokens=nd, num_prefills=npf,
        num_actual_tokens=int(qsl[-1]),
        non_spec_state_indices_tensor=torch.tensor(blocks, dtype=torch.int32),
        has_initial_state=torch.tensor(has_init) if npf else None,
        prefill_has_initial_state=torch.tensor(has_init[nd:]) if npf else None,
        prefill_query_start_loc=(qsl[nd:] - qsl[nd]) if npf else None,
        chunk_indices=None, chunk_offsets=None,
        non_spec_query_start_loc=qsl)
    return types.SimpleNamespace(query_start_loc_cpu=qsl, stock=stock,
                                 compute_num_computed_tokens=lambda: torch.tensor(computed))


@pytest.mark.parametrize("storage,prefill", [("pages", "statecache"), ("server", "statecache"),
                                             ("pages", "runtime")])
def test_two_groups_two_steps_against_reference(plugin, paths, storage, prefill):
    sc_cfg = {"format": "fp32", "storage": storage, "prefill": prefill,
              "statecached": paths["statecached"], "check_every": 1}
    cfg = vllm_config(sc_cfg)
    names = [f"model.layers.{i}.linear_attn" for i in range(4)]
    layers = [plugin.gdn.StatecacheGDNAttention(HF, cfg, n) for n in names]
    ctx = cfg.compilation_config.static_forward_context
    num_blocks, packed = 8, layers[0].get_state_shape()[1][0]
    # vLLM's pages: the state at an offset inside a bigger page. 0xFF bytes are
    # NaN as fp32, what another group's leftovers may look like: a fresh
    # sequence must start from zero all the same.
    pages = [torch.full((num_blocks, packed + 256), 0xFF, dtype=torch.uint8) for _ in range(2)]
    raw = [p[:, 128:128 + packed] for p in pages]
    # groups (0, 1) and (2, 3): position j of each group shares raw[j], as in vLLM
    for i, (name, layer) in enumerate(zip(names, layers)):
        layer.kv_cache = [torch.zeros(num_blocks, 3, CONV_DIM), raw[i % 2]]
        ctx[name] = layer
    builders = [plugin.gdn.StatecacheGDNMetadataBuilder(None, names[0:2], cfg, "cpu"),
                plugin.gdn.StatecacheGDNMetadataBuilder(None, names[2:4], cfg, "cpu")]
    # request r holds block blocks[g][r] in group g (ids unique across groups)
    blocks = [[3, 5, 7], [4, 6, 1]]
    steps = [  # (requests in batch order, num decodes, tokens per request)
        ([0, 1], 0, [3, 2]),          # two fresh prefills
        ([0, 1, 2], 2, [1, 1, 4]),    # mixed: two decodes, then a fresh prefill
        ([0, 2], 2, [1, 1]),          # decodes
    ]
    gen = torch.Generator().manual_seed(1)
    S = {(i, r): torch.zeros(H_V, D, D, dtype=torch.float64) for i in range(4) for r in range(3)}
    done = [0, 0, 0]
    for reqs, nd, lens in steps:
        qsl = [0]
        for n in lens:
            qsl.append(qsl[-1] + n)
        computed = [done[r] for r in reqs]
        has_init = [c > 0 for c in computed]
        mds = [b.build(0, _metadata(nd, qsl, [blocks[g][r] for r in reqs], computed, has_init))
               for g, b in enumerate(builders)]
        pm = plugin.gdn._REGISTRY.pm
        if storage == "pages":   # slot = block id, one pool per state tensor
            assert pm.server is None and pm.shape.slots == num_blocks
            assert pm.table.tolist() == [-1] + list(range(1, num_blocks))
            assert [l._sc_pool for l in layers] == [pm.pools[0], pm.pools[1]] * 2
        else:
            assert pm.shape.layers == 2 and pm.shape.slots == num_blocks - 1
        assert [l._sc_index for l in layers] == [0, 1, 0, 1]
        for g in range(2):
            assert mds[g].sc_slots.tolist() == [pm.table[blocks[g][r]].item() for r in reqs]
        FORWARD.attn_metadata = {n: mds[i // 2] for i, n in enumerate(names)}
        n_tok = qsl[-1]
        for i, layer in enumerate(layers):
            mixed = torch.randn(n_tok + 2, CONV_DIM, generator=gen)   # 2 padded tokens
            a = torch.randn(n_tok + 2, H_V, generator=gen)
            b = torch.randn(n_tok + 2, H_V, generator=gen)
            out = torch.zeros(n_tok + 2, H_V, D, dtype=torch.bfloat16)
            layer._forward_core(mixed, b, a, out)
            assert torch.count_nonzero(out[n_tok:]) == 0
            g_all = -torch.exp(layer.A_log) * F.softplus(a + layer.dt_bias)
            for row, r in enumerate(reqs):
                for t in range(qsl[row], qsl[row + 1]):
                    x = mixed[t]
                    q = l2n(x[:H_QK * D].view(H_QK, D))
                    k = l2n(x[H_QK * D:2 * H_QK * D].view(H_QK, D))
                    v = x[2 * H_QK * D:].view(H_V, D)
                    want, S[i, r] = token(S[i, r], q, k, v, g_all[t], torch.sigmoid(b[t]))
                    torch.testing.assert_close(out[t].double(), want.to(torch.bfloat16).double(),
                                               rtol=2e-2, atol=2e-3)
        for r, n in zip(reqs, lens):
            done[r] += n
    if storage == "pages":   # the states live in vLLM's pages; nothing else there moved
        for p in pages:
            assert (p[:, :128] == 0xFF).all() and (p[:, 128 + packed:] == 0xFF).all()
        state = raw[0][blocks[0][0]].view(torch.float32).view(H_V, D, D)
        torch.testing.assert_close(state.double(), S[0, 0], rtol=1e-4, atol=1e-5)
    FORWARD.attn_metadata = None


def test_builder_rejects_a_batch_beyond_its_buffer(plugin, paths):
    cfg = vllm_config({"format": "fp32", "statecached": paths["statecached"]})
    name = "model.layers.0.linear_attn"
    layer = plugin.gdn.StatecacheGDNAttention(HF, cfg, name)
    layer.kv_cache = [torch.zeros(4, 3, CONV_DIM),
                      torch.zeros(4, layer.get_state_shape()[1][0], dtype=torch.uint8)]
    cfg.compilation_config.static_forward_context[name] = layer
    builder = plugin.gdn.StatecacheGDNMetadataBuilder(None, [name], cfg, "cpu")
    with pytest.raises(plugin.gdn.PoolError, match="batch of 9 rows"):
        builder.build(0, _metadata(9, list(range(10)), [1] * 9, [1] * 9, [True] * 9))


def test_pool_refuses_a_stock_sized_state(plugin, paths):
    cfg = vllm_config({"format": "fp32", "statecached": paths["statecached"]})
    name = "model.layers.0.linear_attn"
    layer = plugin.gdn.StatecacheGDNAttention(HF, cfg, name)
    layer.kv_cache = [torch.zeros(4, 3, CONV_DIM), torch.zeros(4, H_V, D, D)]
    cfg.compilation_config.static_forward_context[name] = layer
    builder = plugin.gdn.StatecacheGDNMetadataBuilder(None, [name], cfg, "cpu")
    with pytest.raises(plugin.gdn.PoolError, match="the plugin declared uint8"):
        builder.build(0, _metadata(1, [0, 1], [1], [1], [True]))


@pytest.mark.parametrize("storage", ["server", "pages"])
def test_storage_follows_when_vllm_rebinds_the_kv_cache(plugin, paths, storage):
    """vLLM 0.26 binds a minimal KV cache to profile CUDA graph memory, then the
    real one: the storage follows the binding and closes the old one (the
    spawned server stops; pages pools move to the new tensors)."""
    cfg = vllm_config({"format": "fp32", "storage": storage,
                       "statecached": paths["statecached"]})
    name = "model.layers.0.linear_attn"
    layer = plugin.gdn.StatecacheGDNAttention(HF, cfg, name)
    cfg.compilation_config.static_forward_context[name] = layer
    packed = layer.get_state_shape()[1][0]

    def bind(num_blocks):
        layer.kv_cache = [torch.zeros(num_blocks, 3, CONV_DIM),
                          torch.zeros(num_blocks, packed, dtype=torch.uint8)]
        builder = plugin.gdn.StatecacheGDNMetadataBuilder(None, [name], cfg, "cpu")
        builder.build(0, _metadata(1, [0, 1], [1], [1], [True]))
        return plugin.gdn._REGISTRY.pm

    spare = 1 if storage == "server" else 0   # server: no slot for the null block
    first = bind(3)
    assert first.shape.slots == 3 - spare
    second = bind(6)
    assert second is not first and second.shape.slots == 6 - spare and first._closed
    assert layer._sc_pm is second
    if storage == "server":
        assert first.server.proc.poll() is not None
    else:
        assert first.server is None and layer._sc_pool is second.pools[0]
        assert layer._sc_rows.data_ptr() == layer.kv_cache[1].data_ptr()
        assert layer._sc_record is second.record
    builder = plugin.gdn.StatecacheGDNMetadataBuilder(None, [name], cfg, "cpu")
    builder.build(0, _metadata(1, [0, 1], [1], [1], [True]))
    assert plugin.gdn._REGISTRY.pm is second   # same binding: same storage


def test_pages_serve_align_mode_block_copies(plugin):
    """Prefix caching ('align'): between steps vLLM copies a request's state
    bytes from its last block to its next one (batch_memcpy of state[block]);
    on "pages" those bytes are the packed state, so the request continues
    exactly from there, and the earlier block keeps the prefix's state."""
    cfg = vllm_config({"format": "damp:16", "check_every": 1}, enable_prefix_caching=True,
                      mamba_cache_mode="align")
    name = "model.layers.0.linear_attn"
    layer = plugin.gdn.StatecacheGDNAttention(HF, cfg, name)
    cfg.compilation_config.static_forward_context[name] = layer
    packed = layer.get_state_shape()[1][0]
    state = torch.zeros(8, packed, dtype=torch.uint8)
    layer.kv_cache = [torch.zeros(8, 3, CONV_DIM), state]
    builder = plugin.gdn.StatecacheGDNMetadataBuilder(None, [name], cfg, "cpu")
    gen = torch.Generator().manual_seed(5)

    def run(block, n_tok, computed):
        md = builder.build(0, _metadata(0 if n_tok > 1 else 1, [0, n_tok], [block], [computed],
                                        [computed > 0]))
        FORWARD.attn_metadata = {name: md}
        mixed = torch.randn(n_tok, CONV_DIM, generator=gen)
        a, b = torch.randn(n_tok, H_V, generator=gen), torch.randn(n_tok, H_V, generator=gen)
        out = torch.zeros(n_tok, H_V, D)
        layer._forward_core(mixed, b, a, out)
        FORWARD.attn_metadata = None
        return mixed, a, b, out

    def reference(S, mixed, a, b):
        g_all = -torch.exp(layer.A_log) * F.softplus(a + layer.dt_bias)
        outs = []
        for t in range(mixed.shape[0]):
            x = mixed[t]
            o, S = token(S, l2n(x[:H_QK * D].view(H_QK, D)),
                         l2n(x[H_QK * D:2 * H_QK * D].view(H_QK, D)),
                         x[2 * H_QK * D:].view(H_V, D), g_all[t], torch.sigmoid(b[t]))
            outs.append(o)
        return torch.stack(outs), S

    mixed, a, b, out = run(3, 4, 0)                  # prefill 4 tokens into block 3
    want, S = reference(torch.zeros(H_V, D, D, dtype=torch.float64), mixed, a, b)
    torch.testing.assert_close(out.double(), want, rtol=0.05, atol=0.02)   # damp:16
    state[5].copy_(state[3])                         # vLLM's align-mode copy to the next block
    prefix = state[3].clone()
    # Continue from block 5: the same as continuing block 3 in place.
    mixed, a, b, out = run(5, 1, 4)
    in_place = torch.zeros(8, packed, dtype=torch.uint8)
    in_place[3] = prefix
    layer.kv_cache = [torch.zeros(8, 3, CONV_DIM), in_place]
    builder = plugin.gdn.StatecacheGDNMetadataBuilder(None, [name], cfg, "cpu")
    md = builder.build(0, _metadata(1, [0, 1], [3], [4], [True]))
    FORWARD.attn_metadata = {name: md}
    again = torch.zeros(1, H_V, D)
    layer._forward_core(mixed, b, a, again)
    FORWARD.attn_metadata = None
    assert torch.equal(out, again)                   # bit for bit
    assert torch.equal(state[5], in_place[3])        # the same state bytes written
    assert torch.equal(state[3], prefix)             # the cached prefix block is untouched
    want1, _ = reference(S, mixed, a, b)
    torch.testing.assert_close(out.double(), want1, rtol=0.05, atol=0.02)
