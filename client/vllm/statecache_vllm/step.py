"""The GDN recurrence of one layer and one vLLM step on the statecache pool
(torch + statecache.torch; no vLLM import, so CI runs it on the CPU backend).

Decode rows: one token each, statecache.torch.decode (the fused kernel).
Prefill rows: vLLM's flat varlen tokens are laid out as [P, T] (T = longest
chunk of the step) and run by statecache.torch.prefill from the stored
states, quantized once (prefill); or, with a one-layer pool, by the engine's
own chunk kernel between statecache.torch.unpack and pack (prefill_with). Padding tokens carry q = k = v = 0, g = 0, beta = 0:
exp(0) = 1 and beta = 0 leave S unchanged exactly. A sequence without an
initial state (its first chunk) gets g = RESET_G on its first token:
exp(RESET_G) == 0 in fp32, so S_bar = 0 * S_old = 0 and the chunk starts from
the zero state exactly, whatever the slot held (its values are finite: the
pool validates every write).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import statecache.torch as sct

RESET_G = -1.0e30


@dataclass(frozen=True)
class PrefillPlan:
    """Where the step's prefill tokens go in the padded [rows, tokens] grid.
    pos[i] = row * tokens + (i - start[row]) for flat prefill token i;
    nonempty[row]: the row has tokens (vLLM may pad with empty rows)."""
    rows: int
    tokens: int
    pos: torch.Tensor        # int64 [num_prefill_tokens], CPU
    nonempty: torch.Tensor   # bool [rows], CPU


def prefill_plan(query_start_loc_cpu: torch.Tensor) -> PrefillPlan:
    """Plan from the prefill rows' cumulative token offsets (CPU, [P + 1],
    starting at 0). ValueError on a decreasing offset or no token at all."""
    qsl = query_start_loc_cpu.to(torch.int64).cpu()
    if qsl.dim() != 1 or qsl.numel() < 2 or int(qsl[0]) != 0:
        raise ValueError(f"query_start_loc: {qsl.tolist()} is not [0, ...] with >= 1 row")
    lens = qsl[1:] - qsl[:-1]
    if bool((lens < 0).any()) or int(qsl[-1]) == 0:
        raise ValueError(f"query_start_loc: {qsl.tolist()} decreases or holds no token")
    rows, tokens = lens.numel(), int(lens.max())
    row = torch.repeat_interleave(torch.arange(rows), lens)
    pos = row * tokens + (torch.arange(int(qsl[-1])) - qsl[:-1][row])
    return PrefillPlan(rows, tokens, pos, lens > 0)


def _grid(x: torch.Tensor, plan: PrefillPlan, pos: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros((plan.rows * plan.tokens,) + tuple(x.shape[1:]))
    out.index_copy_(0, pos, x)
    return out.view((plan.rows, plan.tokens) + tuple(x.shape[1:]))


def decode(pool: "sct.EnginePool", layer: int, slots: torch.Tensor, q: torch.Tensor,
           k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
           fresh: Optional[torch.Tensor] = None, record: torch.Tensor) -> torch.Tensor:
    """One token of `layer` for len(slots) rows: q, k [n, h_qk, d_k] (raw,
    L2-normalized here in fp32 as vLLM's kernels do), v [n, h_v, d_v], g, beta
    fp32 [n, h_v]; fresh bool [n] or None (True: a one-token first chunk,
    started from zero). Returns o fp32 [n, h_v, d_v] (padding rows: zeros)."""
    qn = sct.l2_normalize(q.float())
    kn = sct.l2_normalize(k.float())
    if fresh is not None:
        g = torch.where(fresh.view(-1, 1), torch.full_like(g, RESET_G), g)
    return decode_prepared(pool, layer, slots, qn, kn, v.float().contiguous(), g.contiguous(),
                           beta.contiguous(), record=record)


def decode_prepared(pool: "sct.EnginePool", layer: int, slots: torch.Tensor, q: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                    record: torch.Tensor) -> torch.Tensor:
    """decode() of inputs already prepared (decode_prep.py on CUDA): q, k
    L2-normalized, fresh rows' g = RESET_G, every tensor fp32 and contiguous.
    Returns o fp32 [n, h_v, d_v]."""
    return sct.decode(pool, layer, slots, q, k, v, g, beta, record=record)


def prefill(pool: "sct.EnginePool", layer: int, slots: torch.Tensor, plan: PrefillPlan,
            pos: torch.Tensor, fresh: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
            record: torch.Tensor) -> torch.Tensor:
    """The step's prefill tokens of `layer`: q, k (already L2-normalized), v
    flat [N, heads, dim]; g, beta fp32 [N, h_v]; slots [rows]; pos = plan.pos
    on the tensors' device; fresh bool [rows] (True: start from zero) or None.
    Returns o fp32 [N, h_v, d_v] in the flat order."""
    if slots.numel() != plan.rows:
        raise ValueError(f"slots: {slots.numel()} rows, the plan has {plan.rows}")
    qg, kg, vg = _grid(q, plan, pos), _grid(k, plan, pos), _grid(v, plan, pos)
    gg, bg = _grid(g.float(), plan, pos), _grid(beta.float(), plan, pos)
    if fresh is not None:
        gg[:, 0] = torch.where(fresh.view(-1, 1), torch.full_like(gg[:, 0], RESET_G), gg[:, 0])
    o = sct.prefill(pool, layer, slots, qg, kg, vg, gg, bg, record=record)
    return o.view((plan.rows * plan.tokens,) + tuple(o.shape[2:])).index_select(0, pos)


def prefill_with(kernel, pool: "sct.EnginePool", slots: torch.Tensor,
                 fresh: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, record: torch.Tensor,
                 **kernel_args) -> torch.Tensor:
    """The step's prefill tokens through the engine's chunk kernel (vLLM's
    chunk_gated_delta_rule: varlen over cu_seqlens in kernel_args, states
    value-first [P, h_v, d_v, d_k]) instead of statecache's prefill op: the
    rows' states are unpacked from one-layer `pool` (fresh rows start from
    zero), the kernel runs from them, its final states are packed back (each
    slot fully rewritten; padding rows skipped). q, k (L2-normalized), v flat
    [N, heads, dim], g, beta [N, h_v]; slots int32 [P]; fresh bool [P] or
    None. Returns o [N, h_v, d_v] in the kernel's dtype. ValueError when the
    pool holds more than one layer (pack rewrites whole slots)."""
    if pool.geometry.layers != 1:
        raise ValueError(f"pool: {pool.geometry.layers} layers; prefill_with needs one layer per "
                         "pool (pack rewrites whole slots)")
    init = sct.unpack(pool, slots, record=record)[:, 0].transpose(-1, -2)
    if fresh is not None:
        init = init.masked_fill(fresh.view(-1, 1, 1, 1), 0.0)
    o, final = kernel(q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), g=g.unsqueeze(0),
                      beta=beta.unsqueeze(0), initial_state=init.contiguous(),
                      output_final_state=True, use_qk_l2norm_in_kernel=False, **kernel_args)
    sct.pack(pool, slots, final.float().transpose(-1, -2).unsqueeze(1).contiguous(),
             record=record)
    return o.squeeze(0)
