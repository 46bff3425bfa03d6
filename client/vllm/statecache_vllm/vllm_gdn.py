"""The GDN layer, attention backend and metadata builder that route vLLM's
recurrent states to the statecache pool (vllm 0.26.0).

- StatecacheGDNAttention replaces QwenGatedDeltaNetAttention
  (PluggableLayer.register_oot). Its MambaSpec declares the temporal state as
  uint8[h_v * head_bytes] (layout.placeholder_shape), so vLLM's allocator
  counts packed bytes per block; the conv state stays vLLM's. With the
  "pages" storage those bytes are the state (statecache's ops index vLLM's
  pages), with "server" they stand unused beside a statecached pool
  (pool.py). _forward_core (run by vLLM's own custom op
  vllm::qwen_gdn_attention_core) runs vLLM's conv kernels unchanged and the
  recurrence through statecache.torch: decode rows with the fused decode op,
  prefill rows with the prefill op (step.py); on "pages" a sequence that
  starts from nothing has its state bytes zeroed first (decode_prep.py).
- StatecacheGDNMetadataBuilder (one per KV-cache group) builds vLLM's
  GDNAttentionMetadata and adds, per step:
    sc_slots    int32 pool indices of the non-spec rows (a persistent buffer:
                FULL CUDA graphs read it by address), from the block ids;
    sc_dec_fresh  bool per row: nothing computed yet (persistent buffer);
    sc_plan / sc_pos / sc_fresh   the prefill grid (step.PrefillPlan).
  The first group's builder also opens the storage (first build after the
  KV cache is bound) and checks the error records every check_every steps.
CUDA graphs: the decode path is capturable (no host sync, persistent index
buffer), so vLLM's default FULL_AND_PIECEWISE stays on.
"""
from __future__ import annotations

import atexit
from typing import Dict, List, Optional

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention)
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.layers.mamba.ops.causal_conv1d import (causal_conv1d_fn,
                                                                causal_conv1d_update)
from vllm.platforms import current_platform
from vllm.third_party.flash_linear_attention.ops import fused_post_conv_prep
from vllm.v1.attention.backends.gdn_attn import (GDNAttentionBackend,
                                                 GDNAttentionMetadataBuilder)
from vllm.forward_context import get_forward_context

import statecache.torch as sct
from statecache_vllm import edge, step
from statecache_vllm import slots as slotmap
from statecache_vllm.decode_prep import decode_prep, zero_fresh_rows
from statecache_vllm.config import ConfigError, PluginConfig
from statecache_vllm.layout import placeholder_shape, rank_geometry
from statecache_vllm.pool import PagePools, PoolError, PoolManager

# Under "vllm": vLLM configures that logger tree (INFO, its format); others stay silent.
logger = init_logger("vllm.statecache_vllm")


def check_supported(cfg: PluginConfig, vllm_config) -> None:
    """ConfigError for engine settings the plugin does not handle yet."""
    cache = vllm_config.cache_config
    mode = cache.mamba_cache_mode
    if cfg.storage == "pages":
        # vLLM's 'align' mode copies a request's state bytes from block to block
        # with its own memcpy on its own tensors: on "pages" those bytes are the
        # packed states, so the copies are exact. 'all' keeps a state at every
        # block boundary inside a chunk, which the prefill paths do not write.
        if mode not in ("none", "align"):
            raise ConfigError(f"mamba_cache_mode: '{mode}' is not supported by the statecache "
                              "plugin ('none', or 'align' for prefix caching: "
                              "mamba_cache_mode='align' / --mamba-cache-mode align)")
    elif mode != "none" or cache.enable_prefix_caching:
        raise ConfigError("enable_prefix_caching: storage 'server' needs it off for hybrid "
                          "models (mamba_cache_mode 'none'); 'align' mode copies states "
                          "through vLLM's own copy kernels, which the 'pages' storage "
                          "serves (README: prefix caching)")
    if vllm_config.speculative_config is not None:
        raise ConfigError("speculative_config: speculative decoding is not supported by the "
                          "statecache plugin yet")
    if not current_platform.is_cuda():
        raise ConfigError("platform: the statecache plugin runs on CUDA only")


class StatecacheGDNAttention(QwenGatedDeltaNetAttention):
    """QwenGatedDeltaNetAttention with its recurrent state in the pool (when
    configured; vLLM's own behaviour otherwise)."""

    def __init__(self, config, vllm_config, prefix: str = "", gqa_interleaved_layout=False,
                 reduce_results: bool = True) -> None:
        super().__init__(config, vllm_config, prefix, gqa_interleaved_layout, reduce_results)
        self._sc_cfg = edge.plugin_config(vllm_config)
        self._sc_pm = None      # the rank's PagePools or PoolManager
        self._sc_index = -1     # the layer's position (state tensor)
        self._sc_pool = self._sc_layer = self._sc_record = self._sc_rows = None
        if self._sc_cfg is not None:
            check_supported(self._sc_cfg, vllm_config)
            self._sc_geo = rank_geometry(self.num_k_heads, self.num_v_heads, self.head_k_dim,
                                         self.head_v_dim, self.tp_size)

    def get_state_shape(self):
        shapes = super().get_state_shape()
        cfg = getattr(self, "_sc_cfg", None)
        if cfg is None:
            return shapes
        return shapes[0], placeholder_shape(cfg.format, self._sc_geo)

    def get_state_dtype(self):
        dtypes = super().get_state_dtype()
        if getattr(self, "_sc_cfg", None) is None:
            return dtypes
        return dtypes[0], torch.uint8

    def get_attn_backend(self):
        if getattr(self, "_sc_cfg", None) is None:
            return super().get_attn_backend()
        return StatecacheGDNBackend

    def _forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      core_attn_out: torch.Tensor):
        if self._sc_cfg is None:
            return super()._forward_core(mixed_qkv, b, a, core_attn_out)
        md_all = get_forward_context().attn_metadata
        if md_all is None:
            return  # profile run: no metadata, nothing to compute (vLLM does the same)
        md = md_all[self.prefix]
        pm = self._sc_pm
        if pm is None:
            raise PoolError(f"{self.prefix}: the statecache pool is not open (no metadata "
                            "builder of the plugin ran for this layer's KV-cache group)")
        n_tok = md.num_actual_tokens
        nd, ndt, npf = md.num_decodes, md.num_decode_tokens, md.num_prefills
        if nd + npf == 0:
            return
        kv = self.kv_cache
        conv_state = kv[0] if is_conv_state_dim_first() else kv[0].transpose(-1, -2)
        idx = md.non_spec_state_indices_tensor
        mixed_qkv, b, a = mixed_qkv[:n_tok], b[:n_tok], a[:n_tok]
        w = self.conv1d.weight.view(self.conv1d.weight.size(0), self.conv1d.weight.size(2))
        if npf > 0:
            x = causal_conv1d_fn(mixed_qkv.transpose(0, 1), w, self.conv1d.bias,
                                 activation=self.activation, conv_states=conv_state,
                                 has_initial_state=md.has_initial_state, cache_indices=idx,
                                 query_start_loc=md.non_spec_query_start_loc,
                                 metadata=md).transpose(0, 1)
        else:
            x = causal_conv1d_update(mixed_qkv, conv_state, w, self.conv1d.bias, self.activation,
                                     conv_state_indices=idx[:n_tok], validate_data=False)
        geo = self._sc_geo
        kd, vd = geo.h_qk * geo.d_k, geo.h_v * geo.d_v
        if nd > 0:
            xd = x[:nd]
            slots, fresh = md.sc_slots[:nd], md.sc_dec_fresh[:nd]
            if xd.is_cuda:   # one launch instead of ~25 torch ops (decode_prep.py)
                q, k, v, g, beta = decode_prep(xd, a[:nd], b[:nd], self.A_log, self.dt_bias,
                                               fresh, h_qk=geo.h_qk, d_k=geo.d_k, h_v=geo.h_v,
                                               d_v=geo.d_v, rows=self._sc_rows, slots=slots)
                o = step.decode_prepared(self._sc_pool, self._sc_layer, slots, q, k, v, g, beta,
                                         record=self._sc_record)
            else:
                if self._sc_rows is not None:
                    zero_fresh_rows(self._sc_rows, slots, fresh, geo.h_v)
                q = xd[:, :kd].view(nd, geo.h_qk, geo.d_k)
                k = xd[:, kd:2 * kd].view(nd, geo.h_qk, geo.d_k)
                v = xd[:, 2 * kd:2 * kd + vd].view(nd, geo.h_v, geo.d_v)
                g, beta = sct.gdn_gates(a[:nd], b[:nd], self.A_log, self.dt_bias)
                o = step.decode(self._sc_pool, self._sc_layer, slots, q, k, v, g, beta,
                                fresh=fresh, record=self._sc_record)
            core_attn_out[:nd] = o.to(core_attn_out.dtype)
        if npf > 0:
            q, k, v, g, beta = fused_post_conv_prep(
                conv_output=x[ndt:n_tok], a=a[ndt:n_tok], b=b[ndt:n_tok], A_log=self.A_log,
                dt_bias=self.dt_bias, num_k_heads=geo.h_qk, head_k_dim=geo.d_k,
                head_v_dim=geo.d_v, apply_l2norm=True, output_g_exp=False)
            if self._sc_cfg.prefill == "runtime":   # vLLM's chunk kernel, unpack / pack around it
                # Its rows: every non-decode row of prefill_query_start_loc (vLLM's
                # zero-length padding rows included, as stock vLLM runs them).
                rows = md.prefill_query_start_loc.numel() - 1
                o = step.prefill_with(
                    self.chunk_gated_delta_rule, self._sc_pool, md.sc_slots[nd:nd + rows],
                    ~md.prefill_has_initial_state, q, k, v, g, beta, record=self._sc_record,
                    cu_seqlens=md.prefill_query_start_loc, chunk_indices=md.chunk_indices,
                    chunk_offsets=md.chunk_offsets)
            else:
                slots = md.sc_slots[nd:nd + npf]
                if self._sc_rows is not None:
                    zero_fresh_rows(self._sc_rows, slots, md.sc_fresh, geo.h_v)
                o = step.prefill(self._sc_pool, self._sc_layer, slots, md.sc_plan, md.sc_pos,
                                 md.sc_fresh, q, k, v, g, beta, record=self._sc_record)
            core_attn_out[ndt:n_tok] = o.to(core_attn_out.dtype)


# ---- the pool of this process ------------------------------------------------

class _Registry:
    """This process's state storage and the KV-cache groups of the plugin's
    builders.

    vLLM may bind KV caches more than once (0.26 profiles CUDA graph memory on
    a minimal KV cache first, then discards it and its graphs): the storage
    is opened for a binding (num_blocks and the state tensors' addresses) and
    reopened, the old one closed, when the binding changes."""

    def __init__(self):
        self.pm: Optional[PoolManager] = None
        self.binding = None
        self.first_layer = ""
        self.groups: Dict[tuple, None] = {}

    def open(self, vllm_config, device: torch.device):
        ctx = vllm_config.compilation_config.static_forward_context
        layers = sorted(((name, l) for name, l in ctx.items()
                         if isinstance(l, StatecacheGDNAttention) and l._sc_cfg is not None),
                        key=lambda nl: (nl[1].layer_idx, nl[0]))
        if not layers:
            raise PoolError("no statecache GDN layer in the model")
        first = layers[0][1]
        cfg, geo = first._sc_cfg, first._sc_geo
        want = placeholder_shape(cfg.format, geo)
        ptrs, num_blocks = [], None
        for name, l in layers:
            kv = getattr(l, "kv_cache", None)
            ssm = kv[1] if isinstance(kv, (list, tuple)) and len(kv) > 1 else None
            if not isinstance(ssm, torch.Tensor) or ssm.dtype != torch.uint8 or \
                    tuple(ssm.shape[1:]) != want:
                got = (ssm.dtype, tuple(ssm.shape)) if isinstance(ssm, torch.Tensor) else ssm
                raise PoolError(f"{name}: vLLM bound a temporal state of {got}, the plugin "
                                f"declared uint8 [num_blocks, {want[0]}]")
            if num_blocks is None:
                num_blocks = ssm.shape[0]
            elif ssm.shape[0] != num_blocks:
                raise PoolError(f"{name}: {ssm.shape[0]} blocks, {layers[0][0]} has {num_blocks}")
            ptrs.append((name, ssm.data_ptr()))
        binding = (num_blocks, tuple(ptrs))
        if self.pm is not None and binding == self.binding:
            return self.pm
        if self.pm is not None:
            logger.info("statecache: KV cache re-bound (%d -> %d blocks): reopening the pool",
                        self.binding[0], num_blocks)
            self.pm.close()
            self.pm = None
        index, n_pos = slotmap.position_layers(ptrs)
        slotmap.check_same_group_positions(list(self.groups), index)
        if cfg.storage == "pages":
            tensors = [None] * n_pos
            for name, l in layers:
                tensors[index[name]] = l.kv_cache[1]
            pm = PagePools.open(cfg, geometry=geo, tensors=tensors, device=device)
            logger.info("statecache: format %s over vLLM's pages, %d blocks x %d positions x %d "
                        "heads (%d state bytes per block and position, %.1f MiB), %d GDN "
                        "layers", cfg.format.text, num_blocks, n_pos, geo.h_v,
                        pm.shape.slot_bytes // n_pos, pm.shape.pool_bytes / 2**20, len(layers))
        else:
            pm = PoolManager.open(cfg, geometry=geo, layers=n_pos, num_blocks=num_blocks,
                                  tp_size=first.tp_size, rank=first.tp_rank, device=device,
                                  environ=edge.environ())
            logger.info("statecache: model %s, format %s, %d slots x %d layers x %d heads "
                        "(%d bytes per slot, %.1f MiB pool), %d GDN layers on %d positions",
                        pm.model_id, cfg.format.text, pm.shape.slots, n_pos, geo.h_v,
                        pm.shape.slot_bytes, pm.shape.pool_bytes / 2**20, len(layers), n_pos)
        for name, l in layers:
            l._sc_pm, l._sc_index = pm, index[name]
            l._sc_pool, l._sc_layer, l._sc_record, l._sc_rows = pm.bind(index[name])
        atexit.register(_close_quietly, pm)
        self.pm, self.binding, self.first_layer = pm, binding, layers[0][0]
        return pm


def _close_quietly(pm) -> None:
    try:
        pm.close()
    except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
        pass


_REGISTRY = _Registry()


class StatecacheGDNMetadataBuilder(GDNAttentionMetadataBuilder):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._sc_device = torch.device(device)
        self._sc_layer_names = list(layer_names)
        _REGISTRY.groups[tuple(layer_names)] = None
        rows = max(vllm_config.scheduler_config.max_num_seqs, self.decode_cudagraph_max_bs)
        self._sc_slots = torch.full((rows,), slotmap.PAD, dtype=torch.int32, device=device)
        self._sc_fresh = torch.zeros((rows,), dtype=torch.bool, device=device)
        self._sc_capturing = False

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, fast_build=False):
        md = super().build(common_prefix_len, common_attn_metadata, num_accepted_tokens,
                           num_decode_draft_tokens_cpu, fast_build)
        pm = _REGISTRY.open(self.vllm_config, self._sc_device)
        if _REGISTRY.first_layer in self._sc_layer_names:   # one check per step
            pm.step(self._sc_capturing or (self._sc_device.type == "cuda" and
                                           torch.cuda.is_current_stream_capturing()))
        idx = md.non_spec_state_indices_tensor
        n = idx.numel()
        if n > self._sc_slots.numel():
            raise PoolError(f"batch of {n} rows; the builder holds {self._sc_slots.numel()}")
        md.sc_slots = pm.lookup(idx, out=self._sc_slots[:n])
        # Rows with nothing computed yet start from zero (a one-token prompt is
        # a "decode" row to vLLM's split).
        computed = common_attn_metadata.compute_num_computed_tokens()[:n]
        md.sc_dec_fresh = torch.eq(computed, 0, out=self._sc_fresh[:n])
        md.sc_plan = md.sc_pos = md.sc_fresh = None
        if md.num_prefills > 0:
            m = common_attn_metadata
            qsl = m.query_start_loc_cpu[md.num_decodes:md.num_decodes + md.num_prefills + 1]
            qsl = qsl - qsl[0]
            plan = step.prefill_plan(qsl)
            md.sc_plan = plan
            md.sc_pos = plan.pos.to(self._sc_device, non_blocking=True)
            nonempty = plan.nonempty.to(self._sc_device, non_blocking=True)
            md.sc_fresh = torch.logical_and(~md.prefill_has_initial_state, nonempty)
        return md

    def build_for_cudagraph_capture(self, common_attn_metadata):
        self._sc_capturing = True
        try:
            return super().build_for_cudagraph_capture(common_attn_metadata)
        finally:
            self._sc_capturing = False


class StatecacheGDNBackend(GDNAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return StatecacheGDNMetadataBuilder
