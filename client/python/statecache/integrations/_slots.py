"""The runtime-neutral half of statecache.integrations: a registered model,
the slots of one batch of sequences attached for statecache.torch's ops, the
checks that turn a runtime's tensors into op inputs, conv-window aux bytes,
and trajectory files for calibration.

Shapes (runtime layout, as transformers and FLA pass them to their
recurrence kernels): query / key [B, T, heads, d_k] (heads = h_qk, or h_v
when the runtime repeats key heads for GVA), value [B, T, h_v, d_v], g
[B, T, h_v] (GDN) or [B, T, h_v, d_k] (KDA), beta [B, T, h_v]. Row b of the
batch is slot b of the SlotBatch. Op inputs are FP32 and contiguous: q / k
L2-normalized, key heads deduplicated to h_qk.
"""
from __future__ import annotations

import os
import struct
from typing import Callable, Dict, List, Optional, Sequence

import torch

import statecache.torch as sct
from statecache.errors import FailedPrecondition, InvalidArgument
from statecache.types import Geometry, SlotHandle

RUNTIME_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ModelStates:
    """A runtime model registered on statecached: the Client that registered
    it, its model id, its geometry, and what EnginePool attaches with
    (`target`, default the client's; `token`; `library`, the path of
    libstatecache_dataplane.so, default statecache.attached.find_library)."""

    def __init__(self, client, model_id: str, geometry: Geometry, *, target: Optional[str] = None,
                 token: Optional[str] = None, library: Optional[str] = None):
        self.client = client
        self.model_id = model_id
        self.geometry = geometry
        self.target = target or client.target
        self.token = token
        self.library = library

    @classmethod
    def register(cls, client, model_id: str, geometry: Geometry, format: str = "fp32", *,
                 slots: int, checkpoints: int, layout_file=None, target: Optional[str] = None,
                 token: Optional[str] = None, library: Optional[str] = None) -> "ModelStates":
        """Client.register_model with `geometry`, then the ModelStates of it
        (errors: the client's: AlreadyExists, InvalidArgument naming the
        field, ResourceExhausted naming the budget)."""
        client.register_model(model_id, geometry, format, slots=slots, checkpoints=checkpoints,
                              layout_file=layout_file)
        return cls(client, model_id, geometry, target=target, token=token, library=library)

    def describe(self):
        return self.client.describe_model(self.model_id)


class SlotBatch:
    """`n` slots of a ModelStates for n sequences (row b = slot b), attached
    as one statecache.torch.EnginePool (its lease renewed in the background)
    while `attached`. Server-side calls on the slots (Snapshot, Restore,
    Release) need `detach()` first. Not thread-safe: one runtime thread."""

    def __init__(self, states: ModelStates, n: int,
                 handles: Optional[Sequence[SlotHandle]] = None):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgument(f"batch_size: {n!r} is not a positive number of sequences")
        self.states = states
        self.geometry = states.geometry
        self.n = n
        self.handles: List[SlotHandle] = list(handles) if handles is not None else \
            states.client.allocate_slots(states.model_id, n)
        self.pool: Optional[sct.EnginePool] = None
        self.attach()

    # -- lifecycle -------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return self.pool is not None

    def attach(self) -> None:
        s = self.states
        self.pool = sct.EnginePool(s.target, s.model_id, self.handles, token=s.token,
                                   library=s.library)
        self.device = self.pool.device
        self.slots = self.pool.slot_indices(self.handles)
        self.record = self.pool.new_record()

    def detach(self) -> None:
        """Waits for the ops enqueued so far, raises what they recorded, then
        detaches (the slots go back to server-side calls)."""
        if self.pool is None:
            return
        try:
            self.check()
        finally:
            self.pool.close()
            self.pool = None

    def release(self) -> None:
        """Detaches (best effort) and releases the slots."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.handles:
            self.states.client.release_slots(self.states.model_id, self.handles)
            self.handles = []

    def _pool(self) -> sct.EnginePool:
        if self.pool is None:
            raise FailedPrecondition("the slots are detached (end_turn / close); begin_turn "
                                     "or a new cache attaches them")
        return self.pool

    def check(self) -> None:
        """Raises the first op failure recorded since the last check
        (InvalidArgument naming op, layer and field)."""
        p = self._pool()
        p.check(self.record)

    # -- runtime tensors -> op inputs ----------------------------------------------
    def _check_tensor(self, x, name: str, tail: Sequence[int], tokens: Optional[int]) -> None:
        if not isinstance(x, torch.Tensor):
            raise InvalidArgument(f"{name}: want a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in RUNTIME_DTYPES:
            raise InvalidArgument(f"{name}: dtype {x.dtype} is not one of float32, bfloat16, "
                                  "float16")
        dev = self.device
        if x.device.type != dev.type or (dev.type == "cuda" and x.device != dev):
            raise InvalidArgument(f"{name}: on {x.device}; this cache's slots are on {dev} (the "
                                  "statecached backend's memory)")
        if x.dim() != 2 + len(tail):
            raise InvalidArgument(f"{name}: shape {list(x.shape)}, want [batch, tokens, "
                                  f"{', '.join(str(t) for t in tail)}]")
        if x.shape[0] != self.n:
            raise InvalidArgument(f"{name}: {x.shape[0]} sequences; this cache holds {self.n} "
                                  "slots (batch_size)")
        if tokens is not None and x.shape[1] != tokens:
            raise InvalidArgument(f"{name}: {x.shape[1]} tokens, query has {tokens}")
        if tuple(x.shape[2:]) != tuple(tail):
            raise InvalidArgument(f"{name}: shape {list(x.shape)}, want [{self.n}, "
                                  f"{x.shape[1]}, {', '.join(str(t) for t in tail)}]")

    def check_inputs(self, query, key, value, g, beta,
                     names=("query", "key", "value", "g", "beta")) -> None:
        """Checks runtime tensors (module docstring) against the slots:
        InvalidArgument naming the tensor for a dtype, device, batch or shape
        the ops cannot take. Non-contiguous tensors are fine (op_inputs copies)."""
        geo = self.geometry
        if not isinstance(query, torch.Tensor) or query.dim() != 4:
            raise InvalidArgument(f"{names[0]}: want a [batch, tokens, heads, d_k] tensor")
        heads = query.shape[2]
        if heads not in (geo.h_qk, geo.h_v):
            raise InvalidArgument(f"{names[0]}: {heads} heads; the model has {geo.h_qk} key "
                                  f"heads ({geo.h_v} value heads)")
        t = query.shape[1]
        self._check_tensor(query, names[0], (heads, geo.d_k), None)
        self._check_tensor(key, names[1], (heads, geo.d_k), t)
        self._check_tensor(value, names[2], (geo.h_v, geo.d_v), t)
        self._check_tensor(g, names[3], (geo.h_v, geo.d_k) if geo.arch == "kda" else (geo.h_v,),
                           t)
        self._check_tensor(beta, names[4], (geo.h_v,), t)

    def op_inputs(self, query, key, value, g, beta,
                  names=("query", "key", "value", "g", "beta")):
        """check_inputs, then to_op_inputs; nothing is enqueued either way."""
        self.check_inputs(query, key, value, g, beta, names)
        return to_op_inputs(self.geometry, query, key, value, g, beta)

    # -- ops ------------------------------------------------------------------------
    def decode(self, layer: int, q, k, v, g, beta) -> torch.Tensor:
        """One token of `layer` (op inputs [n, 1, ...]); o fp32 [n, 1, h_v, d_v]."""
        p = self._pool()
        o = sct.decode(p, layer, self.slots, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0],
                       record=self.record)
        return o.unsqueeze(1)

    def prefill(self, layer: int, q, k, v, g, beta) -> torch.Tensor:
        """q.shape[1] tokens of `layer` from the stored states; o fp32 [n, T, h_v, d_v]."""
        return sct.prefill(self._pool(), layer, self.slots, q, k, v, g, beta, record=self.record)

    def read_states(self) -> torch.Tensor:
        """The slots' states, FP32 [n, layers, h_v, d_k, d_v] (key-major, natural order)."""
        return sct.unpack(self._pool(), self.slots, record=self.record)

    def write_states(self, states: torch.Tensor) -> None:
        """FP32 states [n, layers, h_v, d_k, d_v] into the slots (each fully
        overwritten); InvalidArgument naming `states` for a wrong dtype,
        shape, device or a non-contiguous tensor, before anything is written."""
        sct.pack(self._pool(), self.slots, states, record=self.record)


def to_op_inputs(geometry: Geometry, query, key, value, g, beta):
    """Runtime tensors (module docstring) -> the ops' FP32 contiguous inputs
    [B, T, ...]: key heads deduplicated when the runtime repeated them (head
    j of h_v is key head j // (h_v / h_qk)), q and k L2-normalized in FP32
    (x * rsqrt(sum x^2 + 1e-6), transformers' and FLA's l2norm)."""
    rep = query.shape[2] // geometry.h_qk
    if rep > 1:
        query, key = query[:, :, ::rep], key[:, :, ::rep]
    q = sct.l2_normalize(query.float())
    k = sct.l2_normalize(key.float())
    return (q, k, value.float().contiguous(), g.float().contiguous(),
            beta.float().contiguous())


# ---- conv windows as aux bytes --------------------------------------------------

_MAGIC = b"SCW1"
_DT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_DT_BACK = {v: k for k, v in _DT.items()}


def encode_tensors(tensors: Sequence[torch.Tensor]) -> bytes:
    """Tensors (float32 / bfloat16 / float16) as one aux entry: b"SCW1",
    u32 count, then per tensor u8 dtype, u8 ndim, u32 dims, raw bytes
    (little-endian, row-major)."""
    out = [_MAGIC, struct.pack("<I", len(tensors))]
    for t in tensors:
        t = t.detach().contiguous().cpu()
        out.append(struct.pack("<BB", _DT[t.dtype], t.dim()))
        out.append(struct.pack(f"<{t.dim()}I", *t.shape))
        out.append(t.view(torch.uint8).numpy().tobytes())
    return b"".join(out)


def decode_tensors(data: bytes, device, what: str = "aux") -> List[torch.Tensor]:
    """The tensors of encode_tensors, on `device`; InvalidArgument naming
    `what` for bytes that are not such an entry."""
    if data[:4] != _MAGIC:
        raise InvalidArgument(f"{what}: not a statecache conv-window entry")
    (count,), pos = struct.unpack_from("<I", data, 4), 8
    out = []
    for _ in range(count):
        code, ndim = struct.unpack_from("<BB", data, pos)
        pos += 2
        dims = struct.unpack_from(f"<{ndim}I", data, pos)
        pos += 4 * ndim
        dtype = _DT_BACK[code]
        size = torch.Size(dims).numel() * torch.empty((), dtype=dtype).element_size()
        raw = bytearray(data[pos:pos + size])
        if len(raw) != size:
            raise InvalidArgument(f"{what}: truncated conv-window entry")
        pos += size
        out.append(torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(dims).to(device))
    return out


# ---- trajectories (kernels/trajectory/TRAJECTORY_FORMAT.md) ------------------------

class TrajectoryRecorder:
    """Collects one document's op inputs per linear-attention layer (batch
    row 0 of each call, in call order) and writes them as a trajectory file."""

    def __init__(self, geometry: Geometry, source: str):
        self.geometry = geometry
        self.source = source
        self.layer: Optional[int] = None  # set by the runtime's hook before each layer
        self._parts: Dict[int, List[List[torch.Tensor]]] = {}

    def add(self, layer: int, q, k, v, g, beta) -> None:
        """Op inputs [B, T, ...] (SlotBatch.op_inputs' layout) of `layer`."""
        self._parts.setdefault(layer, []).append([x[0].detach().float().cpu()
                                                  for x in (q, k, v, g, beta)])

    def write(self, path: str, domain: str) -> int:
        """Writes the document recorded since the last write; returns its
        token count. InvalidArgument when a layer is missing or the layers
        saw different token counts."""
        from safetensors.torch import save_file

        geo = self.geometry
        tensors, tokens = {}, None
        for i in range(geo.layers):
            if i not in self._parts:
                raise InvalidArgument(f"trajectory: layer {i} recorded nothing (did the forward "
                                      "run with the recorder active?)")
            cols = list(zip(*self._parts[i]))
            for name, chunks in zip(("q", "k", "v", "g", "beta"), cols):
                tensors[f"layer{i}.{name}"] = torch.cat(chunks, 0).contiguous()
            t = tensors[f"layer{i}.q"].shape[0]
            if tokens is not None and t != tokens:
                raise InvalidArgument(f"trajectory: layer {i} has {t} tokens, layer 0 {tokens}")
            tokens = t
        meta = {"format": "statecache.trajectory", "version": "1", "arch": geo.arch,
                "layers": str(geo.layers), "h_qk": str(geo.h_qk), "h_v": str(geo.h_v),
                "d_k": str(geo.d_k), "d_v": str(geo.d_v), "scale": repr(float(geo.scale)),
                "tokens": str(tokens), "domain": domain, "source": self.source}
        save_file(tensors, path, metadata=meta)
        self._parts = {}
        return tokens



def record_documents(model, modules: Sequence[torch.nn.Module], local, rec: "TrajectoryRecorder",
                     documents: Sequence[torch.Tensor], out_dir: str,
                     domain_of: Callable[[int], str]) -> List[str]:
    """Runs `model`'s own forward (no cache) over each document (1-D token
    tensors) with `local.recorder = rec` (the runtime's hooked recurrence
    feeds it) and a forward pre-hook per linear-attention module of
    `modules` naming the layer; writes one trajectory file per document
    (out_dir/docNNNN.safetensors, domain `domain_of(n)`). Returns the paths;
    hooks and the recorder are removed on every exit."""
    hooks = []
    for i, m in enumerate(modules):
        def pre(_module, _args, i=i):
            rec.layer = i
        hooks.append(m.register_forward_pre_hook(pre))
    paths = []
    local.recorder = rec
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            for n, doc in enumerate(documents):
                model(input_ids=doc.reshape(1, -1).to(device), use_cache=False)
                path = os.path.join(out_dir, f"doc{n:04d}.safetensors")
                rec.write(path, domain_of(n))
                paths.append(path)
    finally:
        local.recorder = None
        for h in hooks:
            h.remove()
    return paths


def layout_key_perm(layout_file: bytes) -> torch.Tensor:
    """The key permutation ([layers, h_v, d_k] int32, protected rows first)
    stored in a layout file (kernels/layout/layout_file.h)."""
    from safetensors.torch import load
    return load(bytes(layout_file))["key_perm"]

