"""statecache.torch: the engine path (issue 25) as PyTorch custom ops.

An engine attaches the slots it serves (attached mode: statecached keeps
ownership, the pool is mapped into this process), keeps their pool indices in
its own int32 tensor, and calls the ops below inside its decode step. Every op
is enqueued on torch's current stream without waiting for the host, so a step
captures into one CUDA graph (torch.cuda.CUDAGraph, vLLM / SGLang graph
runners) and replays with new contents in the same input and index tensors;
torch.compile sees them as opaque custom ops with fake (meta) kernels.

    import statecache as sc
    import statecache.torch as sct

    c = sc.Client("unix:/run/sc.sock")
    handles = c.allocate_slots("qwen", 256)
    pool = sct.EnginePool("unix:/run/sc.sock", "qwen", handles)   # renews its lease itself
    idx = pool.slot_indices(handles)          # int32 [256] on the pool's device
    record = pool.new_record()                # one per stream
    for layer in range(pool.geometry.layers):
        o = sct.decode(pool, layer, idx, q, k, v, g, beta, record=record, out_dtype=torch.bfloat16)
    pool.check(record)                        # raises InvalidArgument naming op, layer, field

Contract (kernels/backend/stream_ops.h): slot index -1 is padding (its o is
zeroed, nothing written); bad data (an index outside the pool or repeated,
non-finite q / k / v, g > 0, beta outside [0, 2]) makes that call write
nothing at all, on the device, and is recorded in `record` until `check`;
argument mistakes (dtype, shape, device, contiguity) raise InvalidArgument
naming the argument at once. On the CPU backend the ops run synchronously with
the same record semantics.

An engine that owns its state memory uses EnginePool.local(tensor, geometry,
format) instead: the same ops over that tensor, no server (README, "Engine-
owned memory").

Ops (torch.ops.statecache.*; the pool argument is EnginePool.id):
  decode_(pool, layer, slots, q, k, v, g, beta, o, record)        o: fp32, written
  prefill_(pool, layer, slots, q, k, v, g, beta, o?, record)      T tokens per slot
  pack_(pool, slots, states, record)                              fp32 states -> slots
  unpack_(pool, slots, states, record)                            slots -> fp32 states
  copy_slots_(pool, src, dst, record)                             slot -> slot in the pool
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Dict, Optional, Sequence

import torch

from statecache.attached import (_DTYPES, _ERR_LEN, _handles, AttachedSession, LocalSession,
                                  local_slot_bytes)
from statecache.errors import InvalidArgument, error_from_code
from statecache.types import Geometry, SlotHandle

__all__ = ["EnginePool", "decode", "prefill", "pack", "unpack", "copy_slots", "gdn_gates",
           "l2_normalize"]

_pools: Dict[int, "EnginePool"] = {}
_pools_lock = threading.Lock()
_ids = itertools.count(1)


def _setup(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_statecache_ops_ready", False):
        return
    p, i32p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    err = [ctypes.c_char_p, ctypes.c_int]
    i64, sz, i = ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
    sigs = {
        "sc_slot_indices": [p, u64p, u32p, i, i32p] + err,
        "sc_record_init": [p, p, i64, sz] + err,
        "sc_record_check": [p, p, i64, sz, i] + err,
        "sc_renew": [p] + err,
        "sc_op_decode": [p, i, p, i, i, p, p, p, p, p, p, p, i64, sz] + err,
        "sc_op_prefill": [p, i, p, i, i, i, p, p, p, p, p, p, p, i64, sz] + err,
        "sc_op_pack": [p, p, i, p, p, i64, sz] + err,
        "sc_op_unpack": [p, p, i, p, p, i64, sz] + err,
        "sc_op_copy": [p, p, p, i, p, i64, sz] + err,
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    for name in ("sc_pool_slots", "sc_record_bytes"):
        getattr(lib, name).argtypes = [p]
        getattr(lib, name).restype = i64
    lib.sc_renew_in_background.argtypes = [p]
    lib.sc_renew_in_background.restype = None
    lib._statecache_ops_ready = True


class EnginePool:
    """The attached slots of one model, for an engine's stream-ordered ops.

    Attaches `slots` (an AttachedSession of its own), maps the model's pool
    and, with `renew=True`, renews the lease from a background thread (never
    inside an op). `close()` (or the context manager) detaches: the session's
    fence word is set first, so no op or graph replay writes the pool after.
    """

    def __init__(self, target: str, model_id: str, slots: Sequence[SlotHandle], *,
                 token: Optional[str] = None, lease_ms: int = 0, renew: bool = True,
                 library: Optional[str] = None):
        self._open(AttachedSession(target, model_id, slots, token=token, lease_ms=lease_ms,
                                   library=library), renew)

    @classmethod
    def local(cls, memory: torch.Tensor, geometry: Geometry, format: str = "damp:16", *,
              layout_path: Optional[str] = None, layout_layer: Optional[int] = None,
              library: Optional[str] = None) -> "EnginePool":
        """The ops over `memory`, engine-owned memory (its own cache
        allocation), with no server: a contiguous tensor (slot s = bytes
        [s * slot_bytes(...), ...)) or a [slots, row] view whose rows lie
        apart (slot s = row s: the state part of vLLM's pages), indexed by the
        engine (there are no slot handles: slot_indices raises
        FailedPrecondition). `format` and `layout_path` (a calibrated layout
        file, e.g. from `statecachectl calibrate`; with `layout_layer`, that
        layer of it for a one-layer geometry) fix the packed layout.
        InvalidArgument naming the field for a bad geometry, format, layout
        file or memory (misaligned, smaller than one slot, not on the
        current device). See statecache.attached.LocalSession."""
        pool = cls.__new__(cls)
        pool._open(LocalSession(memory, geometry, format, layout_path=layout_path,
                                layout_layer=layout_layer, library=library), renew=False)
        return pool

    @staticmethod
    def slot_bytes(geometry: Geometry, format: str = "damp:16", *,
                   layout_path: Optional[str] = None, layout_layer: Optional[int] = None,
                   library: Optional[str] = None) -> int:
        """Bytes of one slot of `format` for `geometry`: what EnginePool.local
        needs per sequence."""
        return local_slot_bytes(geometry, format, layout_path=layout_path,
                                layout_layer=layout_layer, library=library)

    def _open(self, session, renew: bool) -> None:
        self.session = session
        self._lib = self.session._lib
        _setup(self._lib)
        self._err = ctypes.create_string_buffer(_ERR_LEN)
        self.geometry: Geometry = self.session.geometry
        self.cuda = self.session.backend == "cuda"
        self.device = getattr(self.session, "device", None) or (
            torch.device("cuda", torch.cuda.current_device()) if self.cuda
            else torch.device("cpu"))
        self.num_slots = int(self._lib.sc_pool_slots(self._handle))
        self.record_bytes = int(self._lib.sc_record_bytes(self._handle))
        if renew:
            self._lib.sc_renew_in_background(self._handle)
        with _pools_lock:
            self.id = next(_ids)
            _pools[self.id] = self

    @property
    def _handle(self):
        h = self.session._handle
        if h is None or not h.value:
            raise error_from_code(9, "pool: the engine pool is closed", "EnginePool")
        return h

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise error_from_code(rc, self._err.value.decode(errors="replace"), what)

    def _stream(self) -> int:
        return int(torch.cuda.current_stream(self.device).cuda_stream) if self.cuda else 0

    def slot_indices(self, slots: Sequence[SlotHandle]) -> torch.Tensor:
        """Pool indices (int32, on the pool's device) of attached handles;
        FailedPrecondition naming slots[i] for one this pool did not attach."""
        n, ids, gens = _handles(list(slots))
        out = (ctypes.c_int32 * max(n, 1))()
        self._check(self._lib.sc_slot_indices(self._handle, ids, gens, n, out, self._err,
                                              _ERR_LEN), "slot_indices")
        return torch.tensor(list(out)[:n], dtype=torch.int32).to(self.device)

    def new_record(self) -> torch.Tensor:
        """An empty error record (uint8 on the pool's device) for one stream."""
        record = torch.empty(self.record_bytes, dtype=torch.uint8, device=self.device)
        self._check(self._lib.sc_record_init(self._handle, record.data_ptr(), record.numel(),
                                             self._stream(), self._err, _ERR_LEN), "new_record")
        return record

    def check(self, record: torch.Tensor, reset: bool = True) -> None:
        """Waits for the current stream, then raises the first failed op since
        the last reset (InvalidArgument naming op, layer and field;
        FailedPrecondition for a detached pool); `reset` empties the record."""
        _record(self, record)
        self._check(self._lib.sc_record_check(self._handle, record.data_ptr(), record.numel(),
                                              self._stream(), int(reset), self._err, _ERR_LEN),
                    "check")

    def renew(self) -> None:
        """Renews the lease now (an RPC; for engines that opted out of the
        background renewal)."""
        self._check(self._lib.sc_renew(self._handle, self._err, _ERR_LEN), "renew")

    def close(self) -> None:
        with _pools_lock:
            _pools.pop(getattr(self, "id", None), None)
        self.session.close()

    def __enter__(self) -> "EnginePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- argument checks (InvalidArgument naming the argument) -----------------

def _pool(pool_id: int) -> EnginePool:
    p = _pools.get(int(pool_id))
    if p is None:
        raise InvalidArgument(f"pool: no open EnginePool with id {pool_id}")
    return p


def _tensor(p: EnginePool, x: torch.Tensor, name: str, shape, dtypes) -> None:
    if not isinstance(x, torch.Tensor):
        raise InvalidArgument(f"{name}: want a torch.Tensor, got {type(x).__name__}")
    if x.device.type != p.device.type:
        raise InvalidArgument(f"{name}: on {x.device}; the pool's backend needs {p.device.type} "
                              "tensors")
    if tuple(x.shape) != tuple(shape):
        raise InvalidArgument(f"{name}: shape {list(x.shape)}, want {list(shape)}")
    if x.dtype not in dtypes:
        raise InvalidArgument(f"{name}: dtype {x.dtype} is not one of "
                              f"{', '.join(str(d) for d in dtypes)}")
    if not x.is_contiguous():
        raise InvalidArgument(f"{name}: not contiguous")


def _record(p: EnginePool, record: torch.Tensor) -> None:
    _tensor(p, record, "record", (record.numel(),), (torch.uint8,))
    if record.numel() < p.record_bytes:
        raise InvalidArgument(f"record: {record.numel()} bytes; this pool needs {p.record_bytes} "
                              "(EnginePool.new_record)")


def _slots(p: EnginePool, slots: torch.Tensor, name: str = "slots") -> int:
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
        raise InvalidArgument(f"{name}: want a 1-D int32 tensor of pool indices")
    _tensor(p, slots, name, (slots.numel(),), (torch.int32,))
    return slots.numel()


_QKV = (torch.float32, torch.bfloat16, torch.float16)
_F32 = (torch.float32,)


def _dtype_code(t: torch.Tensor) -> int:
    return _DTYPES[str(t.dtype).replace("torch.", "")]


def _tokens(p: EnginePool, n: int, tokens: int, q, k, v, g, beta, o) -> None:
    geo = p.geometry
    lead = (n,) if tokens == 0 else (n, tokens)
    _tensor(p, q, "q", lead + (geo.h_qk, geo.d_k), _QKV)
    _tensor(p, k, "k", lead + (geo.h_qk, geo.d_k), (q.dtype,))
    _tensor(p, v, "v", lead + (geo.h_v, geo.d_v), (q.dtype,))
    _tensor(p, g, "g", lead + ((geo.h_v, geo.d_k) if geo.arch == "kda" else (geo.h_v,)), _F32)
    _tensor(p, beta, "beta", lead + (geo.h_v,), _F32)
    if o is not None:
        _tensor(p, o, "o", lead + (geo.h_v, geo.d_v), _F32)


# ---- the custom ops ---------------------------------------------------------

@torch.library.custom_op("statecache::decode_", mutates_args=("o", "record"))
def decode_(pool: int, layer: int, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, o: torch.Tensor,
            record: torch.Tensor) -> None:
    p = _pool(pool)
    n = _slots(p, slots)
    _tokens(p, n, 0, q, k, v, g, beta, o)
    _record(p, record)
    p._check(p._lib.sc_op_decode(p._handle, int(layer), slots.data_ptr(), n, _dtype_code(q),
                                 q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(),
                                 beta.data_ptr(), o.data_ptr(), record.data_ptr(),
                                 record.numel(), p._stream(), p._err, _ERR_LEN), "decode")


@decode_.register_fake
def _(pool, layer, slots, q, k, v, g, beta, o, record) -> None:
    return None


@torch.library.custom_op("statecache::prefill_", mutates_args=("o", "record"))
def prefill_(pool: int, layer: int, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, o: Optional[torch.Tensor],
             record: torch.Tensor) -> None:
    p = _pool(pool)
    n = _slots(p, slots)
    if q.dim() != 4:
        raise InvalidArgument(f"q: shape {list(q.shape)}, want [n, tokens, h_qk, d_k]")
    tokens = q.shape[1]
    if tokens < 1:
        raise InvalidArgument("q: tokens (dim 1) must be >= 1")
    _tokens(p, n, tokens, q, k, v, g, beta, o)
    _record(p, record)
    p._check(p._lib.sc_op_prefill(p._handle, int(layer), slots.data_ptr(), n, tokens,
                                  _dtype_code(q), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                  g.data_ptr(), beta.data_ptr(),
                                  o.data_ptr() if o is not None else None, record.data_ptr(),
                                  record.numel(), p._stream(), p._err, _ERR_LEN), "prefill")


@prefill_.register_fake
def _(pool, layer, slots, q, k, v, g, beta, o, record) -> None:
    return None


def _states_shape(p: EnginePool, n: int):
    geo = p.geometry
    return (n, geo.layers, geo.h_v, geo.d_k, geo.d_v)


@torch.library.custom_op("statecache::pack_", mutates_args=("record",))
def pack_(pool: int, slots: torch.Tensor, states: torch.Tensor, record: torch.Tensor) -> None:
    p = _pool(pool)
    n = _slots(p, slots)
    _tensor(p, states, "states", _states_shape(p, n), _F32)
    _record(p, record)
    p._check(p._lib.sc_op_pack(p._handle, slots.data_ptr(), n, states.data_ptr(),
                               record.data_ptr(), record.numel(), p._stream(), p._err, _ERR_LEN),
             "pack")


@pack_.register_fake
def _(pool, slots, states, record) -> None:
    return None


@torch.library.custom_op("statecache::unpack_", mutates_args=("states", "record"))
def unpack_(pool: int, slots: torch.Tensor, states: torch.Tensor, record: torch.Tensor) -> None:
    p = _pool(pool)
    n = _slots(p, slots)
    _tensor(p, states, "states", _states_shape(p, n), _F32)
    _record(p, record)
    p._check(p._lib.sc_op_unpack(p._handle, slots.data_ptr(), n, states.data_ptr(),
                                 record.data_ptr(), record.numel(), p._stream(), p._err,
                                 _ERR_LEN), "unpack")


@unpack_.register_fake
def _(pool, slots, states, record) -> None:
    return None


@torch.library.custom_op("statecache::copy_slots_", mutates_args=("record",))
def copy_slots_(pool: int, src: torch.Tensor, dst: torch.Tensor, record: torch.Tensor) -> None:
    p = _pool(pool)
    n = _slots(p, src, "src")
    if _slots(p, dst, "dst") != n:
        raise InvalidArgument(f"dst: {dst.numel()} entries, src has {n}")
    _record(p, record)
    p._check(p._lib.sc_op_copy(p._handle, src.data_ptr(), dst.data_ptr(), n, record.data_ptr(),
                               record.numel(), p._stream(), p._err, _ERR_LEN), "copy_slots")


@copy_slots_.register_fake
def _(pool, src, dst, record) -> None:
    return None


# ---- functional wrappers ------------------------------------------------------

def _out_dtype(o: torch.Tensor, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    if out_dtype is None or out_dtype == torch.float32:
        return o
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise InvalidArgument(f"out_dtype: {out_dtype} is not float32, bfloat16 or float16")
    return o.to(out_dtype)


def decode(pool: EnginePool, layer: int, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
           v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, record: torch.Tensor,
           out: Optional[torch.Tensor] = None,
           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """One fused decode step of `layer`; returns o [n, h_v, d_v] (fp32 into
    `out` when given, else a new tensor, converted to `out_dtype`)."""
    geo = pool.geometry
    o = out if out is not None else torch.empty((slots.numel(), geo.h_v, geo.d_v),
                                                dtype=torch.float32, device=q.device)
    torch.ops.statecache.decode_(pool.id, layer, slots, q, k, v, g, beta, o, record)
    return _out_dtype(o, out_dtype)


def prefill(pool: EnginePool, layer: int, slots: torch.Tensor, q: torch.Tensor,
            k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
            record: torch.Tensor, readout: bool = True,
            out_dtype: Optional[torch.dtype] = None) -> Optional[torch.Tensor]:
    """q.shape[1] tokens of `layer` from the stored states, quantized once;
    returns o [n, tokens, h_v, d_v] (None with readout=False)."""
    geo = pool.geometry
    o = torch.empty(tuple(q.shape[:2]) + (geo.h_v, geo.d_v), dtype=torch.float32,
                    device=q.device) if readout else None
    torch.ops.statecache.prefill_(pool.id, layer, slots, q, k, v, g, beta, o, record)
    return _out_dtype(o, out_dtype) if o is not None else None


def pack(pool: EnginePool, slots: torch.Tensor, states: torch.Tensor, *,
         record: torch.Tensor) -> None:
    """FP32 states [n, layers, h_v, d_k, d_v] (an engine's own chunk kernel's
    result) into the slots, each fully overwritten."""
    torch.ops.statecache.pack_(pool.id, slots, states, record)


def unpack(pool: EnginePool, slots: torch.Tensor, *, record: torch.Tensor,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The slots' states as FP32 [n, layers, h_v, d_k, d_v] (padding: zeros)."""
    states = out if out is not None else torch.empty(_states_shape(pool, slots.numel()),
                                                     dtype=torch.float32, device=slots.device)
    torch.ops.statecache.unpack_(pool.id, slots, states, record)
    return states


def copy_slots(pool: EnginePool, src: torch.Tensor, dst: torch.Tensor, *,
               record: torch.Tensor) -> None:
    """Slot dst[i] <- slot src[i] inside the pool (checkpoints; -1 skips)."""
    torch.ops.statecache.copy_slots_(pool.id, src, dst, record)


# ---- engine-side input preparation (unfused) ---------------------------------

def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
              dt_bias: torch.Tensor):
    """(g, beta) in fp32 from a GDN layer's raw projections, as vLLM's and
    transformers' Qwen3-Next compute them: g = -exp(A_log) * softplus(a +
    dt_bias) in fp32; beta = sigmoid(b) rounded to b's dtype (vLLM's packed
    decode kernel and transformers' `b.sigmoid()` both round it: a bf16 model
    feeds the recurrence a bf16 beta), returned as fp32."""
    g = -torch.exp(A_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    return g.contiguous(), beta.contiguous()


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Rows of the last dimension scaled to unit L2 norm (q and k of GDN / KDA),
    computed in fp32 and returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype).contiguous()
