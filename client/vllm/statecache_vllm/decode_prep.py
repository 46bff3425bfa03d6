"""The decode rows' inputs of one GDN layer in one kernel launch (CUDA).

vLLM's packed decode kernel (fused_recurrent_gated_delta_rule_packed_decode)
reads q, k, v straight from the conv output and derives the gates itself; the
statecache decode op takes them prepared. Done with torch ops (step.decode:
l2_normalize, gdn_gates, the fresh-row reset, copies) that is ~25 kernel
launches per layer and step, which CUDA graphs replay but do not remove. This
Triton kernel does the same in one launch, with the packed decode kernel's
arithmetic: q, k L2-normalized in fp32 as x / sqrt(sum(x^2) + 1e-6) (not
rounded back to the model dtype), g = -exp(A_log) * softplus(a + dt_bias)
with softplus spelled where(x <= 20, log(1 + exp(x)), x), beta = sigmoid(b)
rounded to b's dtype, and g = RESET_G on fresh rows (step.py).

With vLLM's pages as the pool ("pages" storage) a fresh row's slot may hold
another KV-cache group's bytes, which RESET_G alone does not neutralize when
they decode to inf or NaN (0 * inf): the kernel also zeroes a fresh row's
state bytes (`rows`, the pool's [blocks, state bytes] view), each program its
value head's bytes, before the decode op reads them. zero_fresh_rows does
the same alone, for prefill rows.

Tested against step.decode's torch path under Triton's interpreter on the CPU
(client/vllm/tests/test_decode_prep.py).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from statecache_vllm.step import RESET_G

SOFTPLUS_THRESHOLD = 20.0


@triton.jit
def _zero_head(rows, slot, i_hv, stride_rows, HBW: tl.constexpr, BW: tl.constexpr):
    # rows: int32 words; zeroes value head i_hv's HBW words of row `slot`.
    head = rows + slot.to(tl.int64) * stride_rows + i_hv * HBW
    o = tl.arange(0, BW)
    for w0 in range(0, HBW, BW):
        tl.store(head + w0 + o, tl.zeros([BW], dtype=tl.int32), mask=w0 + o < HBW)


@triton.jit
def _decode_prep_kernel(x, a, b, A_log, dt_bias, fresh, q_out, k_out, v_out, g_out, beta_out,
                        rows, slots, stride_x, stride_a, stride_b, stride_rows,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, HAS_FRESH: tl.constexpr,
                        ZERO: tl.constexpr, HBW: tl.constexpr, BW: tl.constexpr,
                        RESET: tl.constexpr, THRESHOLD: tl.constexpr):
    # Grid (n, HV): program (i, hv) writes v, g, beta of row i, value head hv,
    # and q, k of key head hv // (HV // H) when hv is the first of its group;
    # with ZERO, a fresh row's head hv state bytes in `rows` too.
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    G: tl.constexpr = HV // H
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    row = x + i_n.to(tl.int64) * stride_x
    if i_hv % G == 0:
        i_h = i_hv // G
        b_q = tl.load(row + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
        b_k = tl.load(row + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        tl.store(q_out + (i_n * H + i_h) * K + o_k, b_q, mask=mask_k)
        tl.store(k_out + (i_n * H + i_h) * K + o_k, b_k, mask=mask_k)
    b_v = tl.load(row + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    tl.store(v_out + (i_n * HV + i_hv) * V + o_v, b_v, mask=mask_v)
    a_val = tl.load(a + i_n * stride_a + i_hv).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b + i_hv).to(tl.float32)
    A_val = tl.load(A_log + i_hv).to(tl.float32)
    dt_val = tl.load(dt_bias + i_hv).to(tl.float32)
    s = a_val + dt_val
    softplus = tl.where(s <= THRESHOLD, tl.log(1.0 + tl.exp(s)), s)
    g = -tl.exp(A_val) * softplus
    if HAS_FRESH:
        is_fresh = tl.load(fresh + i_n) != 0
        g = tl.where(is_fresh, RESET, g)
        if ZERO:
            slot = tl.load(slots + i_n)
            if is_fresh and slot >= 0:
                _zero_head(rows, slot, i_hv, stride_rows, HBW, BW)
    beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)
    tl.store(g_out + i_n * HV + i_hv, g)
    tl.store(beta_out + i_n * HV + i_hv, beta)


@triton.jit
def _zero_fresh_kernel(rows, slots, fresh, stride_rows, HBW: tl.constexpr, BW: tl.constexpr):
    # Grid (n, HV): program (i, hv) zeroes head hv of row slots[i] when fresh[i].
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    slot = tl.load(slots + i_n)
    if tl.load(fresh + i_n) != 0 and slot >= 0:
        _zero_head(rows, slot, i_hv, stride_rows, HBW, BW)


_ZERO_BLOCK_WORDS = 1024


def _state_words(rows: torch.Tensor, h_v: int) -> Tuple[torch.Tensor, int, int]:
    """(rows as int32 words, row stride in words, words per value head) of the
    pool's [blocks, state bytes] uint8 view; ValueError when it is not one."""
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.stride(1) != 1 or \
            rows.shape[1] % (4 * h_v) or rows.stride(0) % 4 or rows.storage_offset() % 4:
        raise ValueError(f"rows: {rows.dtype} {list(rows.shape)} strides {rows.stride()} is not "
                         f"a uint8 [blocks, {h_v} x head bytes] view of 4-byte aligned rows")
    return rows.view(torch.int32), rows.stride(0) // 4, rows.shape[1] // 4 // h_v


def _check_rows_args(slots: torch.Tensor, fresh: Optional[torch.Tensor], n: int) -> None:
    if fresh is None:
        raise ValueError("fresh: needed with rows (the rows to zero)")
    if slots.dtype != torch.int32 or slots.dim() != 1 or slots.shape[0] != n:
        raise ValueError(f"slots: {slots.dtype} {list(slots.shape)}, want int32 [{n}]")


def zero_fresh_rows(rows: torch.Tensor, slots: torch.Tensor, fresh: torch.Tensor,
                    h_v: int) -> None:
    """Zeroes the state bytes of rows[slots[i]] where fresh[i] (bool [n]) and
    slots[i] >= 0, on the tensors' stream: rows is the pool's uint8 [blocks,
    h_v x head bytes] view. ValueError on shapes."""
    n = slots.shape[0] if slots.dim() == 1 else -1
    _check_rows_args(slots, fresh, n)
    if fresh.dim() != 1 or fresh.shape[0] != n:
        raise ValueError(f"fresh: shape {list(fresh.shape)}, want [{n}]")
    words, stride, hbw = _state_words(rows, h_v)
    if n == 0:
        return
    _zero_fresh_kernel[(n, h_v)](words, slots, fresh, stride, HBW=hbw, BW=_ZERO_BLOCK_WORDS)


def decode_prep(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor, fresh: Optional[torch.Tensor], *, h_qk: int, d_k: int,
                h_v: int, d_v: int, rows: Optional[torch.Tensor] = None,
                slots: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
    """(q, k [n, h_qk, d_k], v [n, h_v, d_v], g, beta [n, h_v]), all fp32 and
    contiguous, from the conv output x [n, >= 2 h_qk d_k + h_v d_v] (q | k |
    v along the last dimension, unit stride there), a, b [n, h_v], A_log,
    dt_bias [h_v] and fresh bool [n] or None. With `rows` (the pool's uint8
    [blocks, state bytes] view) and `slots` (int32 [n]), fresh rows' state
    bytes are zeroed as well. ValueError on shapes."""
    n = x.shape[0]
    width = 2 * h_qk * d_k + h_v * d_v
    if x.dim() != 2 or x.shape[1] < width or x.stride(1) != 1:
        raise ValueError(f"x: shape {list(x.shape)} stride {x.stride()}, want [n, >= {width}] "
                         "with unit stride in the last dimension")
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2 or tuple(t.shape) != (n, h_v) or t.stride(1) != 1:
            raise ValueError(f"{name}: shape {list(t.shape)}, want [{n}, {h_v}] unit-stride rows")
    if h_v % h_qk != 0:
        raise ValueError(f"h_v: {h_v} is not a multiple of h_qk {h_qk}")
    if fresh is not None and (fresh.dim() != 1 or fresh.shape[0] != n):
        raise ValueError(f"fresh: shape {list(fresh.shape)}, want [{n}]")
    f32 = dict(dtype=torch.float32, device=x.device)
    q = torch.empty((n, h_qk, d_k), **f32)
    k = torch.empty((n, h_qk, d_k), **f32)
    v = torch.empty((n, h_v, d_v), **f32)
    g = torch.empty((n, h_v), **f32)
    beta = torch.empty((n, h_v), **f32)
    words, stride_rows, hbw = g, 0, 1
    if rows is not None:
        _check_rows_args(slots, fresh, n)
        words, stride_rows, hbw = _state_words(rows, h_v)
    if n == 0:
        return q, k, v, g, beta
    _decode_prep_kernel[(n, h_v)](
        x, a, b, A_log.contiguous(), dt_bias.contiguous(), fresh if fresh is not None else g,
        q, k, v, g, beta, words, slots if rows is not None else g,
        x.stride(0), a.stride(0), b.stride(0), stride_rows,
        H=h_qk, HV=h_v, K=d_k, V=d_v, BK=triton.next_power_of_2(d_k),
        BV=triton.next_power_of_2(d_v), HAS_FRESH=fresh is not None, ZERO=rows is not None,
        HBW=hbw, BW=_ZERO_BLOCK_WORDS, RESET=RESET_G, THRESHOLD=SOFTPLUS_THRESHOLD)
    return q, k, v, g, beta
