"""statecache as the recurrent-state cache of Hugging Face transformers'
Qwen3-Next and Qwen3.5 models (transformers 5.x: Qwen3NextForCausalLM,
Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and their wrappers).

    import statecache as sc
    from statecache.integrations import transformers as sch

    c = sc.Client("unix:/run/statecache.sock")
    states = sch.register_model(c, "qwen", model, "damp:16", slots=8, checkpoints=64,
                                layout_file="qwen.layout")
    with sch.StatecacheCache(model, states, batch_size=2) as cache:
        out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)

How it hooks in (transformers 5.17, models/qwen3_next/modeling_qwen3_next.py):
`StatecacheCache` is a `DynamicCache` whose linear-attention layers are
`StatecacheLinearAttentionLayer`s. Each keeps the layer's convolution window
(the model updates it exactly as with the stock cache) and, where the stock
layer keeps its recurrent state tensor, a `SlotState` marker. The GDN
layer's forward hands that marker to the module-level recurrence functions
(`torch_recurrent_gated_delta_rule` for a decode token,
`torch_chunk_gated_delta_rule` for several tokens); `install()` wraps those
two names in the model's modeling module once, and the wrappers route a call
whose `initial_state` is a marker to statecache (everything else, e.g. the
same model with a stock cache, goes to the original function unchanged):

- decode: statecache.torch.decode on the slots (the fused update);
- several tokens: statecache.torch.prefill from the stored states
  (prefill="statecache", the default), or the runtime's own chunk kernel
  from unpacked states followed by statecache.torch.pack (prefill="runtime";
  the kernel transformers picked, FLA's when installed).

A fresh slot is the zero state, so every layer has a "previous state" from
the start and the stock prefill path is never taken. Full-attention KV stays
in the DynamicCache layers. q / k are L2-normalized in FP32 and deduplicated
to the model's key heads (transformers repeats them for GVA); every op input
is FP32. Not supported: beam search and batch expansion (reorder /
repeat of rows), cropping, packed sequences (cu_seqlens): NotImplementedError.

Multi-turn: `end_turn(sequences)` snapshots every row's slot under the tokens
it consumed, with its convolution windows as aux bytes, and releases the
slots; `begin_turn(input_ids)` looks the next turn's tokens up (LookupPrefix,
within the attention KV this cache still holds), restores the hits into new
slots, puts the windows back and crops the KV to the restored length, so
`generate` prefills only the new tokens.
"""
from __future__ import annotations

import sys
import tempfile
import threading
from typing import List, Optional, Sequence

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache, LinearAttentionLayer

from statecache.errors import FailedPrecondition, InvalidArgument
from statecache.integrations._slots import (ModelStates, SlotBatch, TrajectoryRecorder,
                                            decode_tensors, encode_tensors, record_documents,
                                            to_op_inputs)
from statecache.types import Geometry, PrefixKey

__all__ = ["StatecacheCache", "StatecacheLinearAttentionLayer", "SlotState", "geometry_of",
           "register_model", "install", "record_trajectories", "calibrate", "ModelStates"]

_RECURRENT = "torch_recurrent_gated_delta_rule"
_CHUNK = "torch_chunk_gated_delta_rule"
_local = threading.local()  # .recorder: the TrajectoryRecorder of record_trajectories


# ---- the model side ----------------------------------------------------------------

def _text_config(model_or_config):
    cfg = getattr(model_or_config, "config", model_or_config)
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def geometry_of(model_or_config) -> Geometry:
    """The statecache Geometry of a Qwen3-Next / Qwen3.5 config (its
    linear_attention layers, key / value heads and head dims)."""
    cfg = _text_config(model_or_config)
    types = list(getattr(cfg, "layer_types", None) or [])
    layers = sum(1 for t in types if t == "linear_attention")
    if layers == 0 or not hasattr(cfg, "linear_num_value_heads"):
        raise InvalidArgument(f"model: {type(cfg).__name__} has no linear_attention (GDN) layers")
    return Geometry("gdn", layers, cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                    cfg.linear_key_head_dim, cfg.linear_value_head_dim)


def _gdn_modules(model) -> List[torch.nn.Module]:
    """The model's GDN mixers in layer order."""
    mods = [m for m in model.modules()
            if type(m).__name__.endswith("GatedDeltaNet") and hasattr(m, "A_log")
            and hasattr(m, "conv1d")]
    return sorted(mods, key=lambda m: m.layer_idx)


def register_model(client, model_id: str, model, format: str = "fp32", *, slots: int,
                   checkpoints: int, layout_file=None, target: Optional[str] = None,
                   token: Optional[str] = None, library: Optional[str] = None) -> ModelStates:
    """Registers `model`'s GDN geometry on the server (Client.register_model;
    `layout_file` for a calibrated damp format) and returns its ModelStates."""
    return ModelStates.register(client, model_id, geometry_of(model), format, slots=slots,
                                checkpoints=checkpoints, layout_file=layout_file, target=target,
                                token=token, library=library)


# ---- the recurrence hook -------------------------------------------------------------

class SlotState:
    """Stands in for the recurrent state tensor of GDN layer `index` (0-based
    among the linear-attention layers) of a StatecacheCache: the state
    itself is in the cache's slots."""
    __slots__ = ("cache", "index")

    def __init__(self, cache: "StatecacheCache", index: int):
        self.cache, self.index = cache, index

    def __repr__(self) -> str:
        return f"SlotState(layer={self.index})"


def _wrap(original, decode: bool):
    def recurrence(query, key, value, g=None, beta=None, initial_state=None,
                   output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
        if isinstance(initial_state, SlotState):
            if not use_qk_l2norm_in_kernel:
                raise NotImplementedError("statecache: GDN layers that do not L2-normalize q/k "
                                          "in the kernel")
            cache = initial_state.cache
            return cache._recurrence(initial_state.index, original, decode, query, key, value, g,
                                     beta, kwargs)
        recorder = getattr(_local, "recorder", None)
        if recorder is not None and initial_state is None:
            if recorder.layer is None:
                raise RuntimeError("statecache: a GDN recurrence ran outside a hooked layer")
            recorder.add(recorder.layer, *to_op_inputs(recorder.geometry, query, key, value, g,
                                                       beta))
        return original(query, key, value, g=g, beta=beta, initial_state=initial_state,
                        output_final_state=output_final_state,
                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)

    recurrence._statecache_original = original
    recurrence.__name__ = getattr(original, "__name__", "recurrence")
    recurrence.__doc__ = getattr(original, "__doc__", None)
    return recurrence


def install(model) -> None:
    """Wraps the two recurrence functions of `model`'s modeling module(s)
    (idempotent; calls without a SlotState marker are passed to the originals
    unchanged). StatecacheCache and record_trajectories call it."""
    names = {type(m).__module__ for m in _gdn_modules(model)}
    if not names:
        raise InvalidArgument(f"model: {type(model).__name__} has no GatedDeltaNet layers")
    for name in names:
        mod = sys.modules[name]
        for attr, decode in ((_RECURRENT, True), (_CHUNK, False)):
            fn = getattr(mod, attr, None)
            if fn is None:
                raise NotImplementedError(f"statecache: {name} has no {attr} (a transformers "
                                          "version this integration does not know)")
            if getattr(fn, "_statecache_original", None) is None:
                setattr(mod, attr, _wrap(fn, decode))


# ---- the cache -----------------------------------------------------------------------

class StatecacheLinearAttentionLayer(LinearAttentionLayer):
    """A linear-attention cache layer whose recurrent state lives in the
    StatecacheCache's slots: `conv_states[0]` is the model's convolution
    window [batch, conv_dim, kernel] (model dtype and device, as stock),
    `recurrent_states[0]` a SlotState. `has_previous_state` is True from the
    start (a fresh slot is the zero state)."""

    def __init__(self, cache: "StatecacheCache", index: int, conv_shape: Sequence[int],
                 dtype: torch.dtype, device: torch.device):
        super().__init__()
        self._cache = cache
        self.index = index
        self.dtype, self.device = dtype, device
        self.conv_kernel_size[0] = conv_shape[-1]
        self.conv_states[0] = torch.zeros(tuple(conv_shape), dtype=dtype, device=device)
        self.is_conv_states_initialized[0] = True
        self.has_previous_state[0] = True
        # Not flagged initialized: the stock offload / reorder paths must not touch it.
        self.recurrent_states[0] = SlotState(cache, index)

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0,
                          conv_kernel_size: Optional[int] = None, **kwargs) -> torch.Tensor:
        self._cache._check_activations(conv_states, self.conv_states[0])
        return super().update_conv_state(conv_states, state_idx,
                                         conv_kernel_size=conv_kernel_size, **kwargs)

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs):
        if not isinstance(recurrent_states, SlotState):
            raise RuntimeError("statecache: a GDN layer produced a state tensor outside the "
                               "slots (is the modeling module patched? install(model))")
        return recurrent_states

    def reset(self) -> None:
        self.conv_states[0].zero_()

    def reorder_cache(self, beam_idx: torch.LongTensor):
        raise NotImplementedError("StatecacheCache: beam search (num_beams > 1) is not "
                                  "supported; use greedy or sampling")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("StatecacheCache: batch expansion (num_return_sequences > 1) "
                                  "is not supported; make a cache of that batch_size")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("StatecacheCache: selecting rows is not supported")

    def crop(self, tokens_to_remove: int):
        raise NotImplementedError("StatecacheCache: cropping (assisted generation) is not "
                                  "supported")


class StatecacheCache(DynamicCache):
    """The cache to pass as `past_key_values` to a Qwen3-Next / Qwen3.5
    model's forward or generate: GDN states in `batch_size` statecached
    slots (allocated and attached here, released by close()), convolution
    windows and attention KV in this process (module docstring).

    prefill: "statecache" (the prefill op) or "runtime" (the model's chunk
    kernel from unpacked states, then the pack op). check: check the ops'
    error record after every forward (one host wait; InvalidArgument naming
    op, layer and field). Errors at construction: InvalidArgument naming
    `model` (no GDN layers, a dtype the ops do not take, a device other than
    the slots'), `states` (another geometry), `batch_size`, `prefill`;
    ResourceExhausted when the model has fewer free slots than batch_size."""

    def __init__(self, model, states: ModelStates, batch_size: int = 1, *,
                 prefill: str = "statecache", check: bool = True):
        config = _text_config(model)
        geo = geometry_of(config)
        want = states.geometry
        if (geo.arch, geo.layers, geo.h_qk, geo.h_v, geo.d_k, geo.d_v) != \
                (want.arch, want.layers, want.h_qk, want.h_v, want.d_k, want.d_v):
            raise InvalidArgument(f"states: geometry {want} registered as {states.model_id!r}; "
                                  f"the model's is {geo}")
        if prefill not in ("statecache", "runtime"):
            raise InvalidArgument(f"prefill: {prefill!r} is not 'statecache' or 'runtime'")
        mods = _gdn_modules(model)
        if len(mods) != geo.layers:
            raise InvalidArgument(f"model: {len(mods)} GatedDeltaNet modules, config says "
                                  f"{geo.layers} linear_attention layers")
        w = mods[0].conv1d.weight
        if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise InvalidArgument(f"model: dtype {w.dtype}; the statecache ops take float32, "
                                  "bfloat16 or float16 activations")
        super().__init__(config=config)
        install(model)
        self.states = states
        self._n = batch_size
        self.prefill_mode = prefill
        self.check_every_forward = check
        # Sequence-tokens through the decode op / the prefill path, and restored by begin_turn.
        self.stats = {"decode_tokens": 0, "prefill_tokens": 0, "restored_tokens": 0}
        self._buffer: Optional[torch.Tensor] = None  # prefill="runtime": this forward's states
        self._batch = SlotBatch(states, batch_size)
        try:
            if w.device.type != self._batch.device.type or (
                    w.device.type == "cuda" and w.device != self._batch.device):
                raise InvalidArgument(f"model: on {w.device}; the slots are on "
                                      f"{self._batch.device} (the statecached backend's memory)")
            self._gdn = [m.layer_idx for m in mods]
            for i, m in enumerate(mods):
                shape = (batch_size, m.conv_dim, m.conv_kernel_size)
                self.layers[m.layer_idx] = StatecacheLinearAttentionLayer(self, i, shape, w.dtype,
                                                                          w.device)
        except Exception:
            self._batch.release()
            raise

    @property
    def batch_size(self) -> int:
        """Rows (sequences) this cache serves: one slot each."""
        return self._n

    # -- checks --------------------------------------------------------------------
    def _check_activations(self, x: torch.Tensor, window: torch.Tensor) -> None:
        """Before a GDN layer's convolution window is touched: the batch, dtype
        and device the slots and windows were made for."""
        if not self._batch.attached:
            raise FailedPrecondition("StatecacheCache: the slots are detached (end_turn); call "
                                     "begin_turn(input_ids) before the next turn")
        if x.shape[0] != self.batch_size:
            raise InvalidArgument(f"input_ids: {x.shape[0]} sequences; this StatecacheCache holds "
                                  f"{self.batch_size} slots (batch_size={self.batch_size})")
        if x.dtype != window.dtype:
            raise InvalidArgument(f"hidden_states: dtype {x.dtype}; this StatecacheCache was made "
                                  f"for a {window.dtype} model")
        if x.device != window.device:
            raise InvalidArgument(f"hidden_states: on {x.device}; this StatecacheCache was made "
                                  f"for a model on {window.device}")

    # -- the recurrence (called by the wrapped modeling functions) -----------------
    def _recurrence(self, index: int, original, decode: bool, query, key, value, g, beta,
                    kwargs):
        if kwargs.get("cu_seqlens") is not None:
            raise NotImplementedError("StatecacheCache: packed sequences (cu_seqlens)")
        b = self._batch
        marker = self.layers[self._gdn[index]].recurrent_states[0]
        tokens = query.shape[1]
        if decode or self.prefill_mode == "statecache":
            q, k, v, gg, bb = b.op_inputs(query, key, value, g, beta)
            o = (b.decode if decode else b.prefill)(index, q, k, v, gg, bb).to(query.dtype)
        else:
            b.check_inputs(query, key, value, g, beta)
            if index == 0 or self._buffer is None:
                self._buffer = b.read_states()
            o, final = original(query, key, value, g=g, beta=beta,
                                initial_state=self._buffer[:, index].contiguous(),
                                output_final_state=True, use_qk_l2norm_in_kernel=True, **kwargs)
            self._buffer[:, index] = final
            if index == len(self._gdn) - 1:
                buf, self._buffer = self._buffer, None
                b.write_states(buf)
        if index == 0:
            self.stats["decode_tokens" if decode else "prefill_tokens"] += b.n * tokens
        if index == len(self._gdn) - 1 and self.check_every_forward:
            b.check()
        return o, marker

    # -- states ----------------------------------------------------------------------
    @property
    def slots(self):
        """The SlotHandles of the rows (row b = slots[b]) while attached."""
        return list(self._batch.handles)

    def read_states(self) -> torch.Tensor:
        """FP32 [batch, layers, h_v, d_k, d_v]: every row's GDN states (key-major,
        natural key order whatever the format's layout)."""
        return self._batch.read_states()

    def write_states(self, states: torch.Tensor) -> None:
        """Overwrites every row's GDN states with FP32 [batch, layers, h_v, d_k,
        d_v] (contiguous, on the slots' device); InvalidArgument naming
        `states` otherwise, before anything is written."""
        self._batch.write_states(states)

    def reset(self) -> None:
        """Zero states, zero windows, empty attention KV (a fresh conversation)."""
        super().reset()
        geo = self.states.geometry
        self._batch.write_states(torch.zeros((self.batch_size, geo.layers, geo.h_v, geo.d_k,
                                              geo.d_v), device=self._batch.device))

    # -- multi-turn ------------------------------------------------------------------
    def _rows(self, ids, name: str) -> List[List[int]]:
        rows = ids.tolist() if isinstance(ids, torch.Tensor) else [list(r) for r in ids]
        if len(rows) != self.batch_size:
            raise InvalidArgument(f"{name}: {len(rows)} rows; this StatecacheCache holds "
                                  f"{self.batch_size} (batch_size)")
        return rows

    def end_turn(self, sequences) -> List[PrefixKey]:
        """Ends a turn: waits for the ops, detaches, snapshots row b's slot
        under the tokens it consumed (the first get_seq_length() tokens of
        sequences[b], i.e. generate's output without its last token) with its
        convolution windows as aux bytes (one entry per GDN layer), releases
        the slots and zeroes the windows. Returns the keys. The attention KV
        stays here for begin_turn."""
        rows = self._rows(sequences, "sequences")
        consumed = self.get_seq_length()
        for i, row in enumerate(rows):
            if len(row) < consumed:
                raise InvalidArgument(f"sequences[{i}]: {len(row)} tokens; this cache consumed "
                                      f"{consumed}")
        c, mid = self.states.client, self.states.model_id
        self._batch.detach()
        keys = []
        try:
            for i, row in enumerate(rows):
                aux = [encode_tensors([self.layers[li].conv_states[0][i]]) for li in self._gdn]
                keys.append(c.snapshot(mid, self._batch.handles[i], tokens=row[:consumed],
                                       aux=aux).key)
        finally:
            self._batch.release()
            for li in self._gdn:
                self.layers[li].conv_states[0].zero_()
        return keys

    def begin_turn(self, input_ids) -> int:
        """Starts the next turn of the rows in `input_ids` (the whole
        conversation so far, [batch, tokens]): LookupPrefix of each row within
        the attention KV still held, Restore of the hits into newly allocated
        slots (their windows from the aux bytes), the KV cropped to that
        length; generate then prefills only the tokens after it. Every row
        must hit at the same length, else the turn starts from scratch (zero
        states and windows, empty KV). Returns the restored token count."""
        if self._batch.attached:
            raise FailedPrecondition("begin_turn: the slots are attached (call end_turn first)")
        rows = self._rows(input_ids, "input_ids")
        c, mid = self.states.client, self.states.model_id
        held = self.get_seq_length()
        # at least the last token is fed again: generate needs its logits
        hits = [c.lookup_prefix(mid, tokens=row[:min(held, len(row) - 1)]) for row in rows] \
            if held > 0 else []
        lengths = {h.key.num_tokens for h in hits if h.hit}
        restored = lengths.pop() if hits and all(h.hit for h in hits) and len(lengths) == 1 \
            else 0
        handles = c.allocate_slots(mid, self.batch_size)
        try:
            windows = []
            if restored:
                for i, h in enumerate(hits):
                    r = c.restore(mid, handles[i], h.key, h.lease_id)
                    if len(r.aux) != len(self._gdn):
                        raise InvalidArgument(f"aux: {len(r.aux)} entries restored for "
                                              f"{len(self._gdn)} GDN layers")
                    windows.append(r.aux)
            for j, li in enumerate(self._gdn):
                w = self.layers[li].conv_states[0]
                for i in range(len(windows)):
                    [t] = decode_tensors(windows[i][j], w.device, f"aux[{j}]")
                    w[i].copy_(t)
            for layer in self.layers:
                drop = layer.get_seq_length() - restored if isinstance(layer, CacheLayerMixin) \
                    else 0
                if drop > 0:
                    layer.crop(-drop)  # negative: remove that many tokens (transformers 5.x)
            self._batch = SlotBatch(self.states, self.batch_size, handles=handles)
        except Exception:
            c.release_slots(mid, handles)
            raise
        self.stats["restored_tokens"] += restored * self.batch_size
        return restored

    def close(self) -> None:
        """Detaches and releases the slots (the cache cannot be used after)."""
        self._batch.release()

    def __enter__(self) -> "StatecacheCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- calibration ------------------------------------------------------------------------

def record_trajectories(model, documents: Sequence[torch.Tensor], out_dir: str, *,
                        domain: str = "text", source: Optional[str] = None) -> List[str]:
    """Runs `model`'s own forward (no cache) over each document (1-D token
    tensors) with the recurrence hooked, and writes one trajectory file per
    document (kernels/trajectory/TRAJECTORY_FORMAT.md: activated q, k, v, g,
    beta of every GDN layer, natural key order) into out_dir. Returns the
    paths."""
    geo = geometry_of(model)
    install(model)
    rec = TrajectoryRecorder(geo, source or getattr(model.config, "model_type", "transformers"))
    return record_documents(model, _gdn_modules(model), _local, rec, documents, out_dir,
                            lambda n: domain)


def calibrate(client, model, documents: Sequence[torch.Tensor], model_id: str,
              format: str = "damp:16", *, slots: int, checkpoints: int, domain: str = "text",
              target: Optional[str] = None, token: Optional[str] = None,
              library: Optional[str] = None):
    """record_trajectories, then the Calibrate RPC with model_id (the server
    registers `model_id` with the calibrated layout). Returns (ModelStates,
    CalibrationResult); result.layout_file is the layout to keep."""
    geo = geometry_of(model)
    with tempfile.TemporaryDirectory(prefix="statecache-traj-") as d:
        files = record_trajectories(model, documents, d, domain=domain)
        result = client.calibrate(geo, format, files, model_id=model_id, slots=slots,
                                  checkpoints=checkpoints)
    return ModelStates(client, model_id, geo, target=target, token=token,
                       library=library), result
