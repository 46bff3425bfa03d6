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
def _decode_prep_kernel(x, a, b, A_log, dt_bias, fresh, q_out, k_out, v_out, g_out, beta_out,
                        stride_x, stride_a, stride_b,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, HAS_FRESH: tl.constexpr,
                        RESET: tl.constexpr, THRESHOLD: tl.constexpr):
    # Grid (n, HV): program (i, hv) writes v, g, beta of row i, value head hv,
    # and q, k of key head hv // (HV // H) when hv is the first of its group.
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
        g = tl.where(tl.load(fresh + i_n) != 0, RESET, g)
    beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)
    tl.store(g_out + i_n * HV + i_hv, g)
    tl.store(beta_out + i_n * HV + i_hv, beta)


def decode_prep(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor, fresh: Optional[torch.Tensor], *, h_qk: int, d_k: int,
                h_v: int, d_v: int) -> Tuple[torch.Tensor, ...]:
    """(q, k [n, h_qk, d_k], v [n, h_v, d_v], g, beta [n, h_v]), all fp32 and
    contiguous, from the conv output x [n, >= 2 h_qk d_k + h_v d_v] (q | k |
    v along the last dimension, unit stride there), a, b [n, h_v], A_log,
    dt_bias [h_v] and fresh bool [n] or None. ValueError on shapes."""
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
    if n == 0:
        return q, k, v, g, beta
    _decode_prep_kernel[(n, h_v)](
        x, a, b, A_log.contiguous(), dt_bias.contiguous(), fresh if fresh is not None else g,
        q, k, v, g, beta, x.stride(0), a.stride(0), b.stride(0),
        H=h_qk, HV=h_v, K=d_k, V=d_v, BK=triton.next_power_of_2(d_k),
        BV=triton.next_power_of_2(d_v), HAS_FRESH=fresh is not None, RESET=RESET_G,
        THRESHOLD=SOFTPLUS_THRESHOLD)
    return q, k, v, g, beta
