"""Byte accounting: head sizes of every format (pinned values of
kernels/formats/head_layout.h) and the placeholder vLLM allocates."""
import pytest

from statecache_vllm.config import ConfigError, FormatSpec, parse_format
from statecache_vllm.layout import (RankGeometry, head_bytes, layer_state_bytes,
                                    placeholder_shape, rank_geometry)

# 128 x 128 heads; damp:16 is seed 000's 4096 + 14336 + 1792.
HEAD_128 = {"fp32": 65536, "fp16": 32768, "bf16": 32768, "int8": 18432,
            "int8-hadamard": 18432, "int4": 10240, "int4-hadamard": 10240,
            "fp8-e4m3": 18432, "nvfp4": 9232, "damp:16": 20224, "damp-sr:16": 20224,
            "damp:0": 18432, "damp:128": 32768, "damp:32": 22016}


@pytest.mark.parametrize("fmt,want", sorted(HEAD_128.items()))
def test_head_bytes_128(fmt, want):
    assert head_bytes(parse_format(fmt), 128, 128) == want


def test_head_bytes_aligned_odd_shapes():
    # 64 x 32 damp:3: hi 3*64=192, lo 61*32=1952 -> 2144, meta 61*4=244 -> 2400 (aligned 16)
    assert head_bytes(FormatSpec("damp", 3), 64, 32) == 2400
    for name in ("fp32", "int4", "nvfp4", "damp"):
        assert head_bytes(parse_format(name), 96, 64) % 16 == 0


def test_head_bytes_errors():
    with pytest.raises(ConfigError, match="d_v a positive multiple of 32"):
        head_bytes(FormatSpec("fp32"), 128, 48)
    with pytest.raises(ConfigError, match="k_hi 200 is outside 0..128"):
        head_bytes(FormatSpec("damp", 200), 128, 128)


def test_qwen36_geometry_and_ratio():
    # Qwen3.6-35B-A3B linear attention: 16 key heads, 32 value heads, 128 x 128.
    geo = rank_geometry(16, 32, 128, 128, 1)
    assert geo == RankGeometry(16, 32, 128, 128)
    assert geo.fp32_layer_bytes == 32 * 65536
    damp = layer_state_bytes(FormatSpec("damp", 16), geo)
    assert damp == 32 * 20224 and placeholder_shape(FormatSpec("damp", 16), geo) == (damp,)
    assert round(geo.fp32_layer_bytes / damp, 2) == 3.24
    tp4 = rank_geometry(16, 32, 128, 128, 4)
    assert (tp4.h_qk, tp4.h_v) == (4, 8)
    assert layer_state_bytes(FormatSpec("damp", 16), tp4) * 4 == damp


def test_rank_geometry_errors():
    with pytest.raises(ConfigError, match="linear_num_key_heads: 16 heads do not split over "
                                          "tensor_parallel_size 3"):
        rank_geometry(16, 32, 128, 128, 3)
    with pytest.raises(ConfigError, match="linear_num_value_heads: 24 is not a multiple"):
        rank_geometry(16, 24, 128, 128, 1)
    with pytest.raises(ConfigError, match="tensor_parallel_size: 0"):
        rank_geometry(16, 32, 128, 128, 0)
