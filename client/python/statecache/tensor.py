"""Tensors in and out of statecache: raw little-endian bytes + dtype + shape.

Inputs (q, k, v, g, beta, states) may be numpy arrays, torch tensors (CPU; a
CUDA tensor is copied to host), or TensorData (bytes you already have).
Outputs come back as numpy arrays that VIEW the response bytes (np.frombuffer,
no copy, read-only); call .copy() to write, or to_torch() for a torch tensor.

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
            raise ValueError(f"dtype: {dtype} is not FP32, BF16 or FP16")
        return dtype
    code = _NAMES.get(str(dtype).lower())
    if code is None:
        raise ValueError(f"dtype: {dtype!r} is not fp32, bf16 or fp16")
    return code


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


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
    raise ValueError(f"dtype: torch {t.dtype} is not float32, bfloat16 or float16")


def _is_float(a: np.ndarray, itemsize: int) -> bool:
    """IEEE float of `itemsize` bytes in either byte order."""
    return a.dtype.kind == "f" and a.dtype.itemsize == itemsize


def _numpy_code(a: np.ndarray, dtype) -> int:
    if dtype is not None:
        code = _dtype_code(dtype)
        ok = {FP32: _is_float(a, 4), FP16: _is_float(a, 2),
              BF16: a.dtype in (np.uint16, np.int16) or a.dtype.name == "bfloat16"}[code]
        if not ok:
            raise ValueError(f"array of {a.dtype} cannot be sent as {dtype}")
        return code
    if _is_float(a, 4):
        return FP32
    if _is_float(a, 2):
        return FP16
    if a.dtype.name == "bfloat16":  # ml_dtypes
        return BF16
    raise ValueError(f"numpy {a.dtype} is not float32 or float16 (bf16: pass uint16 "
                     f"bits with dtype='bf16')")


def to_tensor(x: Any, dtype: Optional[Union[str, int]] = None, name: str = "tensor"):
    """A statecache.v1.Tensor from a numpy array, torch tensor, TensorData or a
    Tensor message (returned as is). ValueError (naming `name`) for an
    unsupported dtype or a byte count that does not match the shape."""
    if isinstance(x, pb2().Tensor):
        return x
    if isinstance(x, TensorData):
        code = _dtype_code(x.dtype)
        shape = tuple(int(d) for d in x.shape)
        want = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[code]
        data = bytes(x.data) if not isinstance(x.data, bytes) else x.data
        if len(data) != want:
            raise ValueError(f"{name}: {len(data)} bytes, shape {shape} needs {want}")
        return pb2().Tensor(dtype=code, shape=shape, data=data)
    try:
        if _is_torch(x):
            a, code = _torch_to_numpy(x)
            if dtype is not None and _dtype_code(dtype) != code:
                raise ValueError(f"dtype: torch tensor is not {dtype}")
        else:
            a = np.asarray(x)
            code = _numpy_code(a, dtype)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
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
    raise ValueError(f"tensor: unsupported dtype {t.dtype}")


def to_torch(t):
    """The elements of a Tensor message as a CPU torch tensor sharing the
    message's bytes where torch allows it (torch.frombuffer)."""
    import warnings

    import torch
    if t is None or (not t.shape and not t.data):
        return None
    shape = tuple(t.shape)
    dt = {FP32: torch.float32, FP16: torch.float16, BF16: torch.bfloat16}[t.dtype]
    if not t.data:
        return torch.empty(shape, dtype=dt)
    with warnings.catch_warnings():  # bytes are read-only; the tensor must not be written
        warnings.simplefilter("ignore")
        return torch.frombuffer(t.data, dtype=dt).reshape(shape)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 array -> bfloat16 bits (uint16), round to nearest even."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(a)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out
