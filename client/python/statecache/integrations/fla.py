"""statecache as the recurrent-state cache of flash-linear-attention
(fla-core 0.6) GatedDeltaNet and KDA models (GatedDeltaNetForCausalLM,
KDAForCausalLM; every layer linear attention).

    import statecache as sc
    from statecache.integrations import fla as scf

    c = sc.Client("unix:/run/statecache.sock")
    states = scf.register_model(c, "gdn-tiny", model, "damp:16", slots=8, checkpoints=64,
                                layout_file="gdn.layout")
    with scf.StatecacheFLACache(model, states, batch_size=2) as cache:
        out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)

How it hooks in (fla/layers/gated_deltanet.py, fla/layers/kda.py): an FLA
layer reads `past_key_values[layer_idx]["recurrent_state"]` and passes it as
`initial_state` to the module-level kernels `chunk_gated_delta_rule` /
`fused_recurrent_gated_delta_rule` (`chunk_kda` / `fused_recurrent_kda`).
`StatecacheFLACache` (an FLA Cache) holds a SlotState marker there from the
start (a fresh slot is the zero state); `install()` wraps those names in the
layer modules, and a call whose initial_state is a marker goes to statecache:
one token -> statecache.torch.decode, several -> the prefill op (or, with
prefill="runtime", the original FLA kernel from unpacked states followed by
the pack op). The gates FLA fuses into its kernels (use_gate_in_kernel,
use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound) are applied with
FLA's own reference functions (fla.ops.*.gate) before the op; q / k are
L2-normalized in FP32. The convolution windows stay in FLA's cache
(`conv_state`). Varlen batches (attention_mask -> cu_seqlens) run per
sequence for prefill.

Multi-turn (`end_turn` / `begin_turn`) works as in the transformers
integration, and across processes too: these models have no attention KV.
"""
from __future__ import annotations

import tempfile
import threading
from typing import List, Optional, Sequence

import torch
from fla.models.cache_utils import Cache as _FLACache
from fla.models.cache_utils import FLALayer

from statecache.errors import FailedPrecondition, InvalidArgument
from statecache.integrations._slots import (ModelStates, SlotBatch, TrajectoryRecorder,
                                            decode_tensors, encode_tensors, record_documents,
                                            to_op_inputs)
from statecache.types import Geometry, PrefixKey

__all__ = ["StatecacheFLACache", "SlotState", "geometry_of", "register_model", "install",
           "record_trajectories", "calibrate", "ModelStates"]

_KERNELS = {  # module -> ((name, arch), ...)
    "fla.layers.gated_deltanet": (("chunk_gated_delta_rule", "gdn"),
                                  ("fused_recurrent_gated_delta_rule", "gdn")),
    "fla.layers.kda": (("chunk_kda", "kda"), ("fused_recurrent_kda", "kda")),
}
_local = threading.local()


def _linear_layers(model) -> List[torch.nn.Module]:
    from fla.layers.gated_deltanet import GatedDeltaNet
    from fla.layers.kda import KimiDeltaAttention
    mods = [m for m in model.modules() if isinstance(m, (GatedDeltaNet, KimiDeltaAttention))]
    return sorted(mods, key=lambda m: m.layer_idx)


def geometry_of(model) -> Geometry:
    """Geometry of an FLA GatedDeltaNet / KDA model whose every layer is
    linear attention (InvalidArgument naming `model` otherwise)."""
    mods = _linear_layers(model)
    n = model.config.num_hidden_layers
    if not mods or len(mods) != n:
        raise InvalidArgument(f"model: {len(mods)} of {n} layers are GatedDeltaNet / KDA; "
                              "hybrid FLA models are not supported")
    m = mods[0]
    arch = "kda" if type(m).__name__ == "KimiDeltaAttention" else "gdn"
    return Geometry(arch, n, m.num_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim)


def register_model(client, model_id: str, model, format: str = "fp32", *, slots: int,
                   checkpoints: int, layout_file=None, target: Optional[str] = None,
                   token: Optional[str] = None, library: Optional[str] = None) -> ModelStates:
    """Registers `model`'s geometry (Client.register_model) and returns its ModelStates."""
    return ModelStates.register(client, model_id, geometry_of(model), format, slots=slots,
                                checkpoints=checkpoints, layout_file=layout_file, target=target,
                                token=token, library=library)


class SlotState:
    """Stands in for the recurrent state of layer `index` of a StatecacheFLACache."""
    __slots__ = ("cache", "index")

    def __init__(self, cache, index):
        self.cache, self.index = cache, index

    @property
    def device(self):
        """The slots' device (FLA's cache layers read `state.device`)."""
        return self.cache._device()

    def __repr__(self) -> str:
        return f"SlotState(layer={self.index})"


def activate(arch: str, q, k, v, g, beta, kw):
    """The gates FLA's kernels apply inside (kw: the kernel's keyword
    arguments) applied with FLA's reference functions: (q, k, v, g, beta)
    as the recurrence consumes them, q / k not yet normalized."""
    if kw.get("use_gate_in_kernel"):
        if arch == "gdn":
            from fla.ops.gated_delta_rule.gate import naive_gdn_gate
            g = naive_gdn_gate(g, kw["A_log"], kw.get("dt_bias"))
        elif kw.get("lower_bound") is not None:
            from fla.ops.kda.gate import naive_kda_lowerbound_gate
            g = naive_kda_lowerbound_gate(g, kw["A_log"], kw.get("dt_bias"), kw["lower_bound"])
        else:
            from fla.ops.kda.gate import naive_kda_gate
            g = naive_kda_gate(g, kw["A_log"], kw.get("dt_bias"))
    if kw.get("use_beta_sigmoid_in_kernel"):
        beta = torch.sigmoid(beta.float())
        if kw.get("allow_neg_eigval"):
            beta = beta * 2
    if kw.get("gk") is not None or kw.get("gv") is not None:
        raise NotImplementedError("statecache: gk / gv gates")
    if kw.get("scale") not in (None, k.shape[-1] ** -0.5):
        raise NotImplementedError("statecache: a readout scale other than 1/sqrt(d_k)")
    return q, k, v, g, beta


def _check_layer_inputs(module, args, kwargs):
    """Forward pre-hook of FLA's GDN / KDA layers: checks a StatecacheFLACache's
    batch before the layer runs (other caches: nothing)."""
    cache = kwargs.get("past_key_values")
    if isinstance(cache, StatecacheFLACache):
        cache._check_activations(kwargs.get("hidden_states", args[0] if args else None))
    return None


def _wrap(original, arch: str):
    def kernel(q, k, v, g=None, beta=None, *args, initial_state=None, **kw):
        if args:
            raise TypeError("statecache: positional arguments after beta")
        if isinstance(initial_state, SlotState):
            if not kw.get("use_qk_l2norm_in_kernel"):
                raise NotImplementedError("statecache: layers that do not L2-normalize q / k")
            return initial_state.cache._recurrence(initial_state.index, original, arch, q, k, v, g,
                                                   beta, kw)
        rec = getattr(_local, "recorder", None)
        if rec is not None and initial_state is None and kw.get("cu_seqlens") is None:
            a = activate(arch, q, k, v, g, beta, kw)
            rec.add(rec.layer, *to_op_inputs(rec.geometry, *a))
        return original(q, k, v, g=g, beta=beta, initial_state=initial_state, **kw)

    kernel._statecache_original = original
    kernel.__name__ = getattr(original, "__name__", "kernel")
    return kernel


def install() -> None:
    """Wraps FLA's four GDN / KDA kernel names in its layer modules
    (idempotent; calls without a SlotState marker go to FLA unchanged)."""
    import importlib
    for name, kernels in _KERNELS.items():
        mod = importlib.import_module(name)
        for attr, arch in kernels:
            fn = getattr(mod, attr)
            if getattr(fn, "_statecache_original", None) is None:
                setattr(mod, attr, _wrap(fn, arch))


class StatecacheFLACache(_FLACache):
    """FLA's Cache with every layer's recurrent state in `batch_size`
    statecached slots (conv windows in FLA's `conv_state`). Arguments and
    errors as statecache.integrations.transformers.StatecacheCache."""

    def __init__(self, model, states: ModelStates, batch_size: int = 1, *,
                 prefill: str = "statecache", check: bool = True):
        geo = geometry_of(model)
        want = states.geometry
        if (geo.arch, geo.layers, geo.h_qk, geo.h_v, geo.d_k, geo.d_v) != \
                (want.arch, want.layers, want.h_qk, want.h_v, want.d_k, want.d_v):
            raise InvalidArgument(f"states: geometry {want} registered as {states.model_id!r}; "
                                  f"the model's is {geo}")
        if prefill not in ("statecache", "runtime"):
            raise InvalidArgument(f"prefill: {prefill!r} is not 'statecache' or 'runtime'")
        w = _linear_layers(model)[0].q_proj.weight
        if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise InvalidArgument(f"model: dtype {w.dtype}; the statecache ops take float32, "
                                  "bfloat16 or float16 activations")
        super().__init__()
        install()
        self.states, self._n, self.prefill_mode, self.check_every_forward = \
            states, batch_size, prefill, check
        self.stats = {"decode_tokens": 0, "prefill_tokens": 0, "restored_tokens": 0}
        self._buffer: Optional[torch.Tensor] = None
        self._batch = SlotBatch(states, batch_size)
        if w.device.type != self._batch.device.type or (
                w.device.type == "cuda" and w.device != self._batch.device):
            self._batch.release()
            raise InvalidArgument(f"model: on {w.device}; the slots are on {self._batch.device}")
        for m in _linear_layers(model):
            if not getattr(m, "_statecache_hooked", False):
                m.register_forward_pre_hook(_check_layer_inputs, with_kwargs=True)
                m._statecache_hooked = True
        self._fresh_layers()

    def _check_activations(self, h) -> None:
        """Before an FLA layer touches its conv windows: attached, the batch
        and device the slots were made for (varlen batches: attention_mask rows)."""
        if not self._batch.attached:
            raise FailedPrecondition("StatecacheFLACache: the slots are detached (end_turn); "
                                     "call begin_turn(input_ids) first")
        if isinstance(h, torch.Tensor):
            if h.shape[0] != self._n:
                raise InvalidArgument(f"input_ids: {h.shape[0]} sequences; this "
                                      f"StatecacheFLACache holds {self._n} slots "
                                      f"(batch_size={self._n})")
            if h.device != self._batch.device:
                raise InvalidArgument(f"hidden_states: on {h.device}; the slots are on "
                                      f"{self._batch.device}")

    @property
    def batch_size(self) -> int:
        return self._n

    def _fresh_layers(self, windows=None) -> None:
        """Layer states: the markers, and conv windows (None: the model starts them)."""
        self.layers = []
        for i in range(self.states.geometry.layers):
            layer = FLALayer()
            layer.state = {"recurrent_state": SlotState(self, i), "attn_state": None,
                           "conv_state": windows[i] if windows else (None, None, None),
                           "ffn_state": None}
            layer.is_initialized = True
            self.layers.append(layer)

    # -- the recurrence --------------------------------------------------------------
    def _recurrence(self, index, original, arch, q, k, v, g, beta, kw):
        b = self._batch
        if not b.attached:
            raise FailedPrecondition("StatecacheFLACache: the slots are detached (end_turn); "
                                     "call begin_turn(input_ids) first")
        cu = kw.get("cu_seqlens")
        if cu is not None:  # varlen: [1, total, ...] and sequence boundaries
            lengths = (cu[1:] - cu[:-1]).tolist()
            if len(lengths) != b.n:
                raise InvalidArgument(f"input_ids: {len(lengths)} sequences; this cache holds "
                                      f"{b.n} slots (batch_size={b.n})")
            if all(n == 1 for n in lengths):
                q, k, v, g, beta = (x[0].unsqueeze(1) if x is not None else None
                                    for x in (q, k, v, g, beta))
                o, marker = self._recurrence(index, original, arch, q, k, v, g, beta,
                                             dict(kw, cu_seqlens=None))
                return o.squeeze(1).unsqueeze(0), marker
            return self._varlen_prefill(index, original, arch, q, k, v, g, beta, kw, cu)
        marker = self.layers[index].state["recurrent_state"]
        tokens = q.shape[1]
        decode = tokens == 1
        if decode or self.prefill_mode == "statecache":
            a = activate(arch, q, k, v, g, beta, kw)
            ins = b.op_inputs(*a, names=("q", "k", "v", "g", "beta"))
            o = (b.decode if decode else b.prefill)(index, *ins).to(v.dtype)
        else:
            b.check_inputs(*activate(arch, q, k, v, g, beta, kw), names=("q", "k", "v", "g",
                                                                          "beta"))
            if index == 0 or self._buffer is None:
                self._buffer = b.read_states()
            h0 = self._buffer[:, index]
            if kw.get("state_v_first"):
                h0 = h0.transpose(-1, -2)
            o, final = original(q, k, v, g=g, beta=beta, initial_state=h0.contiguous(),
                                **dict(kw, output_final_state=True))
            if kw.get("state_v_first"):
                final = final.transpose(-1, -2)
            self._buffer[:, index] = final
            if index == len(self.layers) - 1:
                buf, self._buffer = self._buffer, None
                b.write_states(buf)
        if index == 0:
            self.stats["decode_tokens" if decode else "prefill_tokens"] += b.n * tokens
        if index == len(self.layers) - 1 and self.check_every_forward:
            b.check()
        return o, marker

    def _varlen_prefill(self, index, original, arch, q, k, v, g, beta, kw, cu):
        """Sequence by sequence through a one-row view of the batch."""
        b = self._batch
        outs = []
        full = b.slots
        try:
            for i in range(b.n):
                s, e = int(cu[i]), int(cu[i + 1])
                part = [x[:, s:e] for x in (q, k, v, g, beta)]
                b.slots, b.n = full[i:i + 1], 1
                a = activate(arch, *part, kw)
                ins = b.op_inputs(*a, names=("q", "k", "v", "g", "beta"))
                outs.append(b.prefill(index, *ins).to(v.dtype))
        finally:
            b.slots, b.n = full, full.numel()
        if index == 0:
            self.stats["prefill_tokens"] += int(cu[-1])
        if index == len(self.layers) - 1 and self.check_every_forward:
            b.check()
        return torch.cat(outs, 1), self.layers[index].state["recurrent_state"]

    # -- states ------------------------------------------------------------------------
    def read_states(self) -> torch.Tensor:
        """FP32 [batch, layers, h_v, d_k, d_v] (key-major, natural key order)."""
        return self._batch.read_states()

    def write_states(self, states: torch.Tensor) -> None:
        """Overwrites the rows' states (InvalidArgument naming `states`)."""
        self._batch.write_states(states)

    # -- multi-turn --------------------------------------------------------------------
    def _rows(self, ids, name):
        rows = ids.tolist() if isinstance(ids, torch.Tensor) else [list(r) for r in ids]
        if len(rows) != self._n:
            raise InvalidArgument(f"{name}: {len(rows)} rows; this cache holds {self._n}")
        return rows

    def end_turn(self, sequences) -> List[PrefixKey]:
        """Snapshots row b under the first get_seq_length() tokens of
        sequences[b] with its conv windows (q, k, v) as aux bytes, releases
        the slots. Returns the keys."""
        rows = self._rows(sequences, "sequences")
        consumed = self.get_seq_length()
        c, mid = self.states.client, self.states.model_id
        self._batch.detach()
        keys = []
        try:
            for i, row in enumerate(rows):
                if len(row) < consumed:
                    raise InvalidArgument(f"sequences[{i}]: {len(row)} tokens; this cache "
                                          f"consumed {consumed}")
                aux = []
                for layer in self.layers:
                    conv = layer.state["conv_state"]
                    if any(w is None for w in conv):
                        raise FailedPrecondition("end_turn: a layer has no conv window yet "
                                                 "(no token consumed)")
                    aux.append(encode_tensors([w[i] for w in conv]))
                keys.append(c.snapshot(mid, self._batch.handles[i], tokens=row[:consumed],
                                       aux=aux).key)
        finally:
            self._batch.release()
        self._fresh_layers()
        return keys

    def begin_turn(self, input_ids) -> int:
        """LookupPrefix of every row (no attention KV bounds it here, so a new
        cache, e.g. in another process, restores as well), Restore
        of the hits into new slots with their conv windows; every row must hit
        at the same length, else zero states. Returns the restored length;
        generate then consumes input_ids after it."""
        rows = self._rows(input_ids, "input_ids")
        if self._batch.attached:
            if self.get_seq_length() != 0:
                raise FailedPrecondition("begin_turn: the slots are attached (call end_turn "
                                         "first)")
            self._batch.release()  # a new cache (another process): its fresh slots go back
        c, mid = self.states.client, self.states.model_id
        hits = [c.lookup_prefix(mid, tokens=row[:-1]) for row in rows]
        lengths = {h.key.num_tokens for h in hits if h.hit}
        restored = lengths.pop() if all(h.hit for h in hits) and len(lengths) == 1 else 0
        handles = c.allocate_slots(mid, self._n)
        try:
            windows = None
            if restored:
                per_row = []
                for i, h in enumerate(hits):
                    r = c.restore(mid, handles[i], h.key, h.lease_id)
                    per_row.append([decode_tensors(a, self._device(), f"aux[{j}]")
                                    for j, a in enumerate(r.aux)])
                windows = [tuple(torch.stack([per_row[i][j][w] for i in range(self._n)])
                                 for w in range(3)) for j in range(len(self.layers))]
            self._fresh_layers(windows)
            for layer in self.layers:
                layer._seen_tokens = restored
            self._batch = SlotBatch(self.states, self._n, handles=handles)
        except Exception:
            c.release_slots(mid, handles)
            raise
        self.stats["restored_tokens"] += restored * self._n
        return restored

    def _device(self):
        return self._batch.device

    def close(self) -> None:
        self._batch.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def record_trajectories(model, documents: Sequence[torch.Tensor], out_dir: str, *,
                        domain: str = "text", source: Optional[str] = None,
                        domains: Optional[Sequence[str]] = None) -> List[str]:
    """One trajectory file per document from the model's own forward (no
    cache; FLA's kernels hooked), activated inputs in natural key order."""
    geo = geometry_of(model)
    install()
    rec = TrajectoryRecorder(geo, source or getattr(model.config, "model_type", "fla"))
    return record_documents(model, _linear_layers(model), _local, rec, documents, out_dir,
                            lambda n: domains[n] if domains else domain)


def calibrate(client, model, documents: Sequence[torch.Tensor], model_id: str,
              format: str = "damp:16", *, slots: int, checkpoints: int,
              domains: Optional[Sequence[str]] = None, target: Optional[str] = None,
              token: Optional[str] = None, library: Optional[str] = None):
    """record_trajectories + the Calibrate RPC registering `model_id`;
    returns (ModelStates, CalibrationResult)."""
    geo = geometry_of(model)
    with tempfile.TemporaryDirectory(prefix="statecache-traj-") as d:
        files = record_trajectories(model, documents, d, domains=domains)
        result = client.calibrate(geo, format, files, model_id=model_id, slots=slots,
                                  checkpoints=checkpoints)
    return ModelStates(client, model_id, geo, target=target, token=token,
                       library=library), result

