"""Byte accounting of the pool: what one GDN layer's state costs per vLLM
block, so vLLM's allocator counts packed bytes instead of FP32.

head_bytes() mirrors statecache's MakeHeadLayout (kernels/formats/
head_layout.h): sections hi rows | lo codes | lo metadata | global scale, each
16-byte aligned. vLLM sizes its pages before any server is reachable, so the
size is computed here; the pool checks it against the registered model's
ModelInfo.head_bytes.total and refuses to start on a mismatch
(pool.PoolManager), so a drift between the two is an error, never a silent
overcommit.
"""
from __future__ import annotations

from dataclasses import dataclass

from statecache_vllm.config import ConfigError, FormatSpec

ALIGN = 16          # kHeadAlignment
GROUP = 32          # kGroupSize: values per quantization group
NVFP4_BLOCK = 16    # kNvfp4BlockSize


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# format -> (lo code bytes per value numerator, denominator, metadata bytes per
# unit, values per unit); hi rows of damp / damp-sr are fp16 (2 bytes / value).
_LO = {
    "fp32": (4, 1, 0, GROUP), "fp16": (2, 1, 0, GROUP), "bf16": (2, 1, 0, GROUP),
    "int8": (1, 1, 4, GROUP), "int8-hadamard": (1, 1, 4, GROUP), "damp": (1, 1, 4, GROUP),
    "int4": (1, 2, 4, GROUP), "int4-hadamard": (1, 2, 4, GROUP),
    "fp8-e4m3": (1, 1, 4, GROUP), "damp-sr": (1, 1, 4, GROUP),
    "nvfp4": (1, 2, 1, NVFP4_BLOCK),
}


def head_bytes(fmt: FormatSpec, d_k: int, d_v: int) -> int:
    """Bytes of one packed d_k x d_v head in `fmt` (a multiple of 16).
    ConfigError for shapes statecache rejects (d_v not a multiple of 32,
    k_hi outside 0..d_k)."""
    if d_k <= 0 or d_v <= 0 or d_v % GROUP:
        raise ConfigError(f"geometry: d_k {d_k} x d_v {d_v}: statecache needs d_v a positive "
                          f"multiple of {GROUP}")
    if not 0 <= fmt.k_hi <= d_k:
        raise ConfigError(f"format: '{fmt.text}': k_hi {fmt.k_hi} is outside 0..{d_k}")
    num, den, meta_unit, unit_values = _LO[fmt.name]
    lo_rows = d_k - fmt.k_hi
    off = _align(fmt.k_hi * 2 * d_v)                        # hi rows (fp16)
    off = _align(off + lo_rows * (d_v * num // den))        # lo codes
    off = _align(off + lo_rows * (d_v // unit_values) * meta_unit)  # lo metadata
    if fmt.name == "nvfp4":
        off = _align(off + 4)                               # fp32 global scale
    return off


@dataclass(frozen=True)
class RankGeometry:
    """One tensor-parallel rank's share of a GDN layer: h_qk / tp key heads,
    h_v / tp value heads (what that rank's statecache model registers)."""
    h_qk: int
    h_v: int
    d_k: int
    d_v: int

    @property
    def fp32_layer_bytes(self) -> int:
        return self.h_v * self.d_k * self.d_v * 4


def rank_geometry(num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                  tp_size: int) -> RankGeometry:
    """The rank's geometry; ConfigError when the heads do not split evenly
    (vLLM's own GDN layer needs that too) or GVA is not a whole ratio."""
    if tp_size < 1:
        raise ConfigError(f"tensor_parallel_size: {tp_size} must be >= 1")
    for name, h in (("linear_num_key_heads", num_k_heads), ("linear_num_value_heads",
                                                            num_v_heads)):
        if h % tp_size:
            raise ConfigError(f"{name}: {h} heads do not split over tensor_parallel_size "
                              f"{tp_size}")
    g = RankGeometry(num_k_heads // tp_size, num_v_heads // tp_size, head_k_dim, head_v_dim)
    if g.h_v % g.h_qk:
        raise ConfigError(f"linear_num_value_heads: {num_v_heads} is not a multiple of "
                          f"linear_num_key_heads {num_k_heads} (GVA)")
    return g


def layer_state_bytes(fmt: FormatSpec, geo: RankGeometry) -> int:
    """Bytes of one layer's recurrent state of one sequence in the pool: the
    size of the uint8 stand-in vLLM allocates and counts per block."""
    return geo.h_v * head_bytes(fmt, geo.d_k, geo.d_v)


def placeholder_shape(fmt: FormatSpec, geo: RankGeometry) -> tuple:
    """Shape of the temporal-state entry of the GDN MambaSpec (dtype uint8)
    in place of vLLM's (h_v, d_v, d_k) FP32 / BF16 state."""
    return (layer_state_bytes(fmt, geo),)
