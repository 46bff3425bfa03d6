"""Tensors in and out of statecache: raw little-endian bytes + dtype + shape.

Inputs (q, k, v, g, beta, states) may be numpy arrays, torch tensors (CPU; a
CUDA tensor is copied to host), or TensorData (bytes you already have).
Outputs follow the inputs: with numpy (or TensorData) inputs they come back
as numpy arrays that VIEW the response bytes (np.frombuffer, no copy,
read-only; .copy() to write); when q is a torch tensor they come back as
writable torch tensors on q's device (one copy from the response bytes, then
a host-to-device copy for CUDA). to_torch() converts either kind.

dtypes: float32 -> DTYPE_FP32, float16 -> DTYPE_FP16, torch.bfloat16 ->
DTYPE_BF16. numpy has no bfloat16: pass raw bf16 bits as uint16 with
dtype="bf16" (or TensorData), or an ml_dtypes.bfloat16 array.

Copies: one, from the array into the protobuf message (protobuf bytes fields
need a bytes object); none when the input is TensorData with bytes. An input
that is not C-contiguous little-endian is made so first (one more copy).

    t = to_tensor(np.zeros((4, 32, 128), np.float32))   # statecache.v1.Tensor
    a = to_numpy(t)                                      # view, shape (4, 32, 128)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from statecache._stubs import pb2
from statecache.errors import InvalidArgument

# proto DType values.
FP32, BF16, FP16 = 1, 2, 3
_NAMES = {"fp32": FP32, "float32": FP32, "bf16": BF16, "bfloat16": BF16, "fp16": FP16,
          "float16": FP16}
_ITEMSIZE = {FP32: 4, BF16: 2, FP16: 2}


@dataclass(frozen=True)
class TensorData:
    """Raw bytes with an explicit dtype ("fp32" | "bf16" | "fp16" or the proto
    value) and shape; sent without conversion or copy."""
    data: Union[bytes, bytearray, memoryview]
    dtype: Union[str, int]
    shape: Tuple[int, ...]


def _dtype_code(dtype) -> int:
    if isinstance(dtype, int):
        if dtype not in _ITEMSIZE:
            raise InvalidArgument(f"dtype: {dtype} is not FP32, BF16 or FP16")
        return dtype
    code = _NAMES.get(str(dtype).lower())
    if code is None:
        raise InvalidArgument(f"dtype: {dtype!r} is not fp32, bf16 or fp16")
    return code


def is_torch(x: Any) -> bool:
    """True for a torch.Tensor (without importing torch)."""
    # __module__ is None for some classes (protobuf 7's message classes).
    return (type(x).__module__ or "").startswith("torch") and hasattr(x, "detach")


def _torch_to_numpy(x) -> Tuple[np.ndarray, int]:
    import torch  # only reached when x is a torch tensor
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), BF16
    if t.dtype == torch.float16:
        return t.numpy(), FP16
    if t.dtype == torch.float32:
        return t.numpy(), FP32
    raise InvalidArgument(f"dtype: torch {t.dtype} is not float32, bfloat16 or float16")


def _is_float(a: np.ndarray, itemsize: int) -> bool:
    """IEEE float of `itemsize` bytes in either byte order."""
    return a.dtype.kind == "f" and a.dtype.itemsize == itemsize


def _numpy_code(a: np.ndarray, dtype) -> int:
    if dtype is not None:
        code = _dtype_code(dtype)
        ok = {FP32: _is_float(a, 4), FP16: _is_float(a, 2),
              BF16: a.dtype in (np.uint16, np.int16) or a.dtype.name == "bfloat16"}[code]
        if not ok:
            raise InvalidArgument(f"array of {a.dtype} cannot be sent as {dtype}")
        return code
    if _is_float(a, 4):
        return FP32
    if _is_float(a, 2):
        return FP16
    if a.dtype.name == "bfloat16":  # ml_dtypes
        return BF16
    raise InvalidArgument(f"numpy {a.dtype} is not float32 or float16 (bf16: pass uint16 "
                          f"bits with dtype='bf16'; lists: np.asarray(x, np.float32))")


def to_tensor(x: Any, dtype: Optional[Union[str, int]] = None, name: str = "tensor",
              method: str = "") -> Any:
    """A statecache.v1.Tensor from a numpy array, torch tensor, TensorData or a
    Tensor message (returned as is). InvalidArgument (a ValueError; message
    naming `name`, `method` the calling client method) for an unsupported
    dtype, a byte count that does not match the shape, or anything else."""
    if isinstance(x, pb2().Tensor):
        return x
    if isinstance(x, TensorData):
        try:
            code = _dtype_code(x.dtype)
        except InvalidArgument as e:
            raise InvalidArgument(f"{name}: {e.message}", method) from None
        shape = tuple(int(d) for d in x.shape)
        want = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[code]
        data = bytes(x.data) if not isinstance(x.data, bytes) else x.data
        if len(data) != want:
            raise InvalidArgument(f"{name}: {len(data)} bytes, shape {shape} needs {want}",
                                  method)
        return pb2().Tensor(dtype=code, shape=shape, data=data)
    if x is None:
        raise InvalidArgument(f"{name}: missing (None)", method)
    try:
        if is_torch(x):
            a, code = _torch_to_numpy(x)
            if dtype is not None and _dtype_code(dtype) != code:
                raise InvalidArgument(f"dtype: torch tensor is not {dtype}")
        else:
            if not isinstance(x, np.ndarray):
                raise InvalidArgument(f"{type(x).__name__} is not a numpy array, torch tensor "
                                      f"or TensorData")
            a = x
            code = _numpy_code(a, dtype)
    except InvalidArgument as e:
        raise InvalidArgument(f"{name}: {e.message}", method) from None
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    a = np.ascontiguousarray(a)
    return pb2().Tensor(dtype=code, shape=a.shape, data=a.tobytes())


def to_numpy(t, bf16_as: str = "float32") -> Optional[np.ndarray]:
    """The elements of a Tensor message as a numpy array: a read-only view of
    its bytes for FP32 / FP16 (no copy); BF16 is widened to float32 (a copy),
    or returned as raw uint16 bits with bf16_as="uint16". None for an empty
    (unset) tensor."""
    if t is None or (not t.shape and not t.data):
        return None
    shape = tuple(t.shape)
    if t.dtype == FP32:
        return np.frombuffer(t.data, dtype="<f4").reshape(shape)
    if t.dtype == FP16:
        return np.frombuffer(t.data, dtype="<f2").reshape(shape)
    if t.dtype == BF16:
        bits = np.frombuffer(t.data, dtype="<u2").reshape(shape)
        if bf16_as == "uint16":
            return bits
        return (bits.astype(np.uint32) << 16).view(np.float32)
    raise InvalidArgument(f"tensor: unsupported dtype {t.dtype}")


def to_torch(x: Any, device: Any = None) -> Any:
    """A writable torch tensor from a Tensor message, a numpy array (e.g.
    UpdateResult.o of a numpy call) or a torch tensor, on `device` (default:
    CPU, or the tensor's own device). BF16 messages give torch.bfloat16.
    Copies the bytes once (torch tensors over read-only response bytes would
    be unsafe to write); None for None or an empty message."""
    import torch
    if x is None:
        return None
    if is_torch(x):
        return x if device is None else x.to(device)
    if isinstance(x, np.ndarray):
        out = torch.from_numpy(np.array(x, copy=True, order="C"))
    else:
        if not x.shape and not x.data:
            return None
        shape = tuple(x.shape)
        dt = {FP32: torch.float32, FP16: torch.float16, BF16: torch.bfloat16}.get(x.dtype)
        if dt is None:
            raise InvalidArgument(f"tensor: unsupported dtype {x.dtype}")
        out = (torch.frombuffer(bytearray(x.data), dtype=dt).reshape(shape) if x.data
               else torch.empty(shape, dtype=dt))
    return out if device is None else out.to(device)


def output(t: Any, like: Any = None) -> Any:
    """A response Tensor as the caller's kind: a torch tensor on like's device
    when `like` (the call's q) is a torch tensor, else to_numpy(t)."""
    if like is not None and is_torch(like):
        return to_torch(t, like.device)
    return to_numpy(t)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 array -> bfloat16 bits (uint16), round to nearest even."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(a)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out
