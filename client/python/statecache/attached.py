"""Attached mode from Python (issue 10): the fused decode update runs in this
process on statecached's slot pool, mapped through shared memory (CPU
backend, statecached --shared_pools) or CUDA IPC, while statecached keeps
allocation, leases, snapshots, restores and eviction.

A thin ctypes binding of libstatecache_dataplane.so (the C ABI in
client/python/native/dataplane_c_api.h over the C++ AttachedSession). It takes
raw pointers, so it works with PyTorch tensors (CUDA or CPU) and numpy arrays
(CPU) without copies; nothing here imports torch unless a CUDA session needs
the current stream.

    import statecache as sc
    from statecache.attached import AttachedSession

    c = sc.Client("unix:/run/statecache.sock")
    slots = c.allocate_slots("qwen", 8)
    with AttachedSession("unix:/run/statecache.sock", "qwen", slots) as a:
        for layer in range(a.geometry.layers):
            # q, k: [B, h_qk, d_k]; v: [B, h_v, d_v] (fp32 / bf16 / fp16, one
            # dtype); g: fp32 [B, h_v] (GDN) or [B, h_v, d_k] (KDA); beta:
            # fp32 [B, h_v]; o: fp32 [B, h_v, d_v], written. CUDA tensors are
            # ordered after torch.cuda.current_stream() (or stream=...).
            a.decode_update(layer, q, k, v, g, beta, o)

The library (find_library): an explicit `library=` path, else
$STATECACHE_DATAPLANE_LIB, else statecache/_native/ next to this file (where
`pip install ./client/python` bundles it, see README "Install"), else Bazel's
bazel-bin/client/python/ of this checkout (`bazel build
//client/python:libstatecache_dataplane.so`). It links Debian's gRPC++,
protobuf and absl shared libraries and the CUDA runtime statically: it loads
on machines without a GPU or CUDA driver (CPU backend).
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional, Sequence

from statecache.errors import InvalidArgument, error_from_code
from statecache.types import Geometry, SlotHandle

_LIB_NAME = "libstatecache_dataplane.so"
_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
_ERR_LEN = 1024


def find_library(path: Optional[str] = None) -> str:
    """Path of libstatecache_dataplane.so: `path`, $STATECACHE_DATAPLANE_LIB,
    statecache/_native/, Bazel's output (first that exists). FileNotFoundError
    naming what was looked at and how to get the library when none exists."""
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    candidates = [path, os.environ.get("STATECACHE_DATAPLANE_LIB"),
                  os.path.join(here, "_native", _LIB_NAME)]
    if os.environ.get("TEST_SRCDIR"):
        candidates.append(os.path.join(os.environ["TEST_SRCDIR"], "statecache", "client",
                                       "python", _LIB_NAME))
    candidates.append(os.path.join(repo, "bazel-bin", "client", "python", _LIB_NAME))
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    note = ""
    try:
        with open(os.path.join(here, "_native", "NOT_BUILT")) as f:
            note = f" This installation has no bundled library ({f.read().strip()})."
    except OSError:
        pass
    raise FileNotFoundError(
        f"{_LIB_NAME} not found (looked at: {', '.join(c for c in candidates if c)}).{note} "
        "Reinstall from the repository with bazel on PATH (`pip install ./client/python` "
        "builds and bundles it), or with STATECACHE_PREBUILT_DATAPLANE_LIB=/path/to/"
        f"{_LIB_NAME} to bundle a prebuilt one; or set STATECACHE_DATAPLANE_LIB (or pass "
        "library=) to a built one.")


_loaded = {}


def _load(path: str) -> ctypes.CDLL:
    lib = _loaded.get(path)
    if lib is not None:
        return lib
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:  # a shared library it links is missing
        raise OSError(f"cannot load {path}: {e} (it needs Debian 12's libgrpc++1.51, "
                      "libprotobuf32 and libabsl20220623: README, \"Install\")") from e
    p, u64p, u32p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    lib.sc_attach.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, u64p, u32p,
                              ctypes.c_int, ctypes.c_int64, ctypes.POINTER(p), ctypes.c_char_p,
                              ctypes.c_int]
    lib.sc_attach.restype = ctypes.c_int
    lib.sc_attached_geometry.argtypes = [p, ctypes.POINTER(ctypes.c_int32),
                                         ctypes.POINTER(ctypes.c_float)]
    lib.sc_attached_geometry.restype = None
    lib.sc_decode_update.argtypes = [p, ctypes.c_int, u64p, u32p, ctypes.c_int, ctypes.c_int,
                                     p, p, p, p, p, p, ctypes.c_size_t, ctypes.c_char_p,
                                     ctypes.c_int]
    lib.sc_decode_update.restype = ctypes.c_int
    lib.sc_detach.argtypes = [p, ctypes.c_char_p, ctypes.c_int]
    lib.sc_detach.restype = ctypes.c_int
    lib.sc_close.argtypes = [p]
    lib.sc_close.restype = None
    i32p, cp = ctypes.POINTER(ctypes.c_int32), ctypes.c_char_p
    lib.sc_local_slot_bytes.argtypes = [i32p, ctypes.c_float, cp, cp, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int64), cp, ctypes.c_int]
    lib.sc_local_slot_bytes.restype = ctypes.c_int
    lib.sc_local_pool.argtypes = [cp, i32p, ctypes.c_float, cp, cp, ctypes.c_int, p,
                                  ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(p), cp,
                                  ctypes.c_int]
    lib.sc_local_pool.restype = ctypes.c_int
    _loaded[path] = lib
    return lib


def _handles(slots: Sequence[SlotHandle]):
    n = len(slots)
    ids = (ctypes.c_uint64 * n)(*[s.id for s in slots])
    gens = (ctypes.c_uint32 * n)(*[s.generation for s in slots])
    return n, ids, gens


def _tensor(x, field: str, shape, dtypes, cuda: bool):
    """(pointer, dtype code) of a dense torch tensor or numpy array."""
    if hasattr(x, "data_ptr") and hasattr(x, "is_cuda"):  # torch.Tensor
        name = str(x.dtype).replace("torch.", "")
        if bool(x.is_cuda) != cuda:
            raise InvalidArgument(f"{field}: a {'CUDA' if x.is_cuda else 'CPU'} tensor; this "
                                  f"session's backend needs {'CUDA' if cuda else 'CPU'} memory")
        contiguous = x.is_contiguous()
        ptr, got = x.data_ptr(), tuple(x.shape)
    elif hasattr(x, "__array_interface__"):  # numpy
        if cuda:
            raise InvalidArgument(f"{field}: a host array; this session's backend is CUDA")
        name, contiguous = x.dtype.name, bool(x.flags["C_CONTIGUOUS"])
        ptr, got = x.ctypes.data, tuple(x.shape)
    else:
        raise InvalidArgument(f"{field}: want a torch.Tensor or numpy.ndarray, got {type(x)}")
    if got != tuple(shape):
        raise InvalidArgument(f"{field}: shape {list(got)}, want {list(shape)}")
    if name not in dtypes:
        raise InvalidArgument(f"{field}: dtype {name} is not one of {', '.join(dtypes)}")
    if not contiguous:
        raise InvalidArgument(f"{field}: not contiguous")
    return ptr, _DTYPES[name]


class _NativeHandle:
    """A handle of the native library (sc_attach / sc_local_pool), freed by
    sc_close; the error of a failed call raised as its StateCacheError."""

    _handle = None

    def _check(self, rc: int, method: str):
        if rc != 0:
            raise error_from_code(rc, self._err.value.decode(errors="replace"), method)

    def close(self) -> None:
        """Frees the handle: an attached session detaches (best effort) and
        closes; a local pool's memory stays the caller's."""
        if self._handle is not None and self._handle.value:
            self._lib.sc_close(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class AttachedSession(_NativeHandle):
    """Attaches `slots` of `model_id` (a data-plane session of its own) and
    maps the model's pool. `token`: bearer token of servers with tenants;
    `lease_ms`: session lease (0 = server default; renewed inside
    decode_update at half of it). Errors are statecache.StateCacheError
    subclasses carrying the server's / binding's message (naming the field).
    One thread at a time."""

    def __init__(self, target: str, model_id: str, slots: Sequence[SlotHandle], *,
                 token: Optional[str] = None, lease_ms: int = 0,
                 library: Optional[str] = None):
        self._lib = _load(find_library(library))
        self._handle = ctypes.c_void_p()
        self._err = ctypes.create_string_buffer(_ERR_LEN)
        self.slots = list(slots)
        n, ids, gens = _handles(self.slots)
        rc = self._lib.sc_attach(target.encode(), (token or "").encode(), model_id.encode(),
                                 ids, gens, n, int(lease_ms), ctypes.byref(self._handle),
                                 self._err, _ERR_LEN)
        self._check(rc, "AttachSlots")
        self._default = (n, ids, gens)
        geo = (ctypes.c_int32 * 7)()
        scale = ctypes.c_float()
        self._lib.sc_attached_geometry(self._handle, geo, ctypes.byref(scale))
        self.geometry = Geometry("kda" if geo[0] == 1 else "gdn", geo[1], geo[2], geo[3],
                                 geo[4], geo[5], scale.value)
        self.backend = "cuda" if geo[6] == 1 else "cpu"

    def decode_update(self, layer: int, q, k, v, g, beta, o, *,
                      slots: Optional[Sequence[SlotHandle]] = None, stream=None) -> None:
        """One fused decode step of `layer` for `slots` (default: all attached
        slots, in attach order); writes o. On CUDA the kernel runs after the
        work enqueued on `stream` (a torch.cuda.Stream, a raw cudaStream_t
        int, or None = torch.cuda.current_stream()); o is complete on return."""
        if self._handle is None or not self._handle.value:
            raise error_from_code(9, "slots: the session is closed", "DecodeUpdate")
        n, ids, gens = self._default if slots is None else _handles(list(slots))
        geo, cuda = self.geometry, self.backend == "cuda"
        qp, dt = _tensor(q, "q", (n, geo.h_qk, geo.d_k), _DTYPES, cuda)
        kp, kdt = _tensor(k, "k", (n, geo.h_qk, geo.d_k), _DTYPES, cuda)
        vp, vdt = _tensor(v, "v", (n, geo.h_v, geo.d_v), _DTYPES, cuda)
        if kdt != dt or vdt != dt:
            raise InvalidArgument("k, v: must have q's dtype")
        g_shape = (n, geo.h_v, geo.d_k) if geo.arch == "kda" else (n, geo.h_v)
        gp, _ = _tensor(g, "g", g_shape, ("float32",), cuda)
        bp, _ = _tensor(beta, "beta", (n, geo.h_v), ("float32",), cuda)
        op, _ = _tensor(o, "o", (n, geo.h_v, geo.d_v), ("float32",), cuda)
        raw_stream = 0
        if cuda:
            if stream is None:
                import torch  # only CUDA sessions need it
                stream = torch.cuda.current_stream()
            raw_stream = int(getattr(stream, "cuda_stream", stream) or 0)
        rc = self._lib.sc_decode_update(self._handle, int(layer), ids, gens, n, dt, qp, kp, vp,
                                        gp, bp, op, raw_stream, self._err, _ERR_LEN)
        self._check(rc, "DecodeUpdate")

    def detach(self) -> None:
        """Ends the attachment: the slots go back to server-side use."""
        if self._handle is not None and self._handle.value:
            self._check(self._lib.sc_detach(self._handle, self._err, _ERR_LEN), "DetachSlots")


def _geometry_array(geometry: Geometry):
    arch = str(geometry.arch).lower()
    if arch not in ("gdn", "kda"):
        raise InvalidArgument(f"geometry.arch: {geometry.arch!r} is not 'gdn' or 'kda'")
    return (ctypes.c_int32 * 6)(1 if arch == "kda" else 0, int(geometry.layers),
                                int(geometry.h_qk), int(geometry.h_v), int(geometry.d_k),
                                int(geometry.d_v))


def local_slot_bytes(geometry: Geometry, format: str, *, layout_path: Optional[str] = None,
                     layout_layer: Optional[int] = None, library: Optional[str] = None) -> int:
    """Bytes of one slot (every layer's states of one sequence) of `format`
    for `geometry` (and a calibrated layout file; `layout_layer`: a one-layer
    geometry taking that layer of a file of more layers): the unit a
    LocalSession's memory is sized in. InvalidArgument naming the field for
    a bad geometry, format, layout file or layer."""
    lib = _load(find_library(library))
    err = ctypes.create_string_buffer(_ERR_LEN)
    out = ctypes.c_int64()
    rc = lib.sc_local_slot_bytes(_geometry_array(geometry), float(geometry.scale),
                                 str(format).encode(), (layout_path or "").encode(),
                                 _layer_arg(layout_layer), ctypes.byref(out), err, _ERR_LEN)
    if rc != 0:
        raise error_from_code(rc, err.value.decode(errors="replace"), "local_slot_bytes")
    return int(out.value)


def _layer_arg(layout_layer: Optional[int]) -> int:
    if layout_layer is None:
        return -1
    if isinstance(layout_layer, bool) or not isinstance(layout_layer, int) or layout_layer < 0:
        raise InvalidArgument(f"layout_layer: {layout_layer!r} is not a layer index >= 0")
    return layout_layer


def _local_memory_extent(memory, geometry: Geometry, format: str, layout_path: Optional[str],
                         layout_layer: Optional[int], library: Optional[str]):
    """(bytes from memory's first byte to its last slot's end, slot stride in
    bytes or 0 for packed) of a LocalSession's `memory`; InvalidArgument
    naming "memory" for a layout it cannot index."""
    esize = memory.element_size()
    rows_view = memory.dim() == 2 and (memory.size(1) <= 1 or memory.stride(1) == 1)
    if not rows_view:
        if not memory.is_contiguous():
            raise InvalidArgument(
                f"memory: not contiguous (shape {tuple(memory.shape)}, strides "
                f"{tuple(memory.stride())}); want a contiguous tensor or [slots, row] rows with "
                "stride(1) == 1")
        return memory.numel() * esize, 0
    rows, row_bytes, stride = memory.size(0), memory.size(1) * esize, memory.stride(0) * esize
    if rows == 0:
        raise InvalidArgument("memory: no rows")
    if rows == 1:
        stride = row_bytes  # a lone row's stride(0) means nothing
    if stride < row_bytes:
        raise InvalidArgument(f"memory: rows of {row_bytes} bytes overlap (stride(0) is "
                              f"{stride} bytes)")
    slot_bytes = local_slot_bytes(geometry, format, layout_path=layout_path,
                                  layout_layer=layout_layer, library=library)
    if row_bytes < slot_bytes:
        raise InvalidArgument(f"memory: a row of {row_bytes} bytes holds no slot of {slot_bytes} "
                              f"bytes ({format})")
    return (rows - 1) * stride + slot_bytes, stride


class LocalSession(_NativeHandle):
    """The engine ops' pool over memory the caller owns, with no server
    (client/cpp/local_pool.h). `memory` (CPU: the CPU backend; CUDA: the
    CUDA backend on the tensor's device, which must be the current one; one
    CUDA device per process) is either
      - a 2-D tensor [n, row] whose rows are contiguous (stride(1) == 1) and
        may lie apart (stride(0) > row: the state part of an engine's bigger
        per-sequence records, e.g. vLLM's mamba pages): n slots, slot s at
        row s; a row must hold a slot (row bytes >= slot_bytes) and its bytes
        past slot_bytes are never touched; or
      - any other contiguous tensor: `memory.nbytes // local_slot_bytes(...)`
        slots, slot s at byte s * slot_bytes.
    Slots are in the server's slot layout. `layout_path` / `layout_layer`:
    a calibrated layout file, and for a one-layer geometry the file's layer
    it takes (one pool per layer over a many-layer file). The session keeps
    a reference to `memory`; the caller keeps it unchanged in size and place while the
    session is open. statecache.torch.EnginePool.local wraps it for the
    ops."""

    def __init__(self, memory, geometry: Geometry, format: str, *,
                 layout_path: Optional[str] = None, layout_layer: Optional[int] = None,
                 library: Optional[str] = None):
        import torch  # local pools serve torch engines
        if not isinstance(memory, torch.Tensor):
            raise InvalidArgument(f"memory: want a torch.Tensor, got {type(memory).__name__}")
        if memory.device.type not in ("cpu", "cuda"):
            raise InvalidArgument(f"memory: on {memory.device}; want a cpu or cuda tensor")
        if memory.is_cuda and torch.cuda.current_device() != memory.device.index:
            raise InvalidArgument(f"memory: on {memory.device}, the current CUDA device is "
                                  f"cuda:{torch.cuda.current_device()}; make {memory.device} "
                                  "current (the ops run on the current device's streams)")
        extent, stride = _local_memory_extent(memory, geometry, format, layout_path,
                                              layout_layer, library)
        self._lib = _load(find_library(library))
        self._handle = ctypes.c_void_p()
        self._err = ctypes.create_string_buffer(_ERR_LEN)
        self.backend = "cuda" if memory.is_cuda else "cpu"
        self.device = memory.device
        backend = f"cuda:{memory.device.index}" if memory.is_cuda else "cpu"
        rc = self._lib.sc_local_pool(backend.encode(), _geometry_array(geometry),
                                     float(geometry.scale), str(format).encode(),
                                     (layout_path or "").encode(), _layer_arg(layout_layer),
                                     ctypes.c_void_p(memory.data_ptr()), extent, stride,
                                     ctypes.byref(self._handle), self._err, _ERR_LEN)
        if rc != 0:
            self._handle = None
        self._check(rc, "LocalSession")
        self.memory = memory
        self.geometry = geometry

