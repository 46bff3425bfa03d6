"""The GDN recurrence in plain torch float64 (DESIGN.md section 2), the
yardstick of the CPU tests: S [h_v, d_k, d_v]; per token
S_bar = exp(g) S; delta = v - S_bar^T k; S = S_bar + beta k delta^T;
o = S^T (q / sqrt(d_k)); value head h uses key head h // (h_v / h_qk)."""
import torch


def l2n(x):
    x = x.double()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def token(S, q, k, v, g, beta):
    """One token of one sequence: q, k [h_qk, d_k] normalized, v [h_v, d_v],
    g, beta [h_v]; returns (o [h_v, d_v], S)."""
    h_v, d_k = S.shape[0], S.shape[1]
    rep = h_v // q.shape[0]
    qh, kh = q.double().repeat_interleave(rep, 0), k.double().repeat_interleave(rep, 0)
    Sb = torch.exp(g.double()).view(-1, 1, 1) * S
    delta = v.double() - torch.einsum("hkv,hk->hv", Sb, kh)
    S = Sb + beta.double().view(-1, 1, 1) * torch.einsum("hk,hv->hkv", kh, delta)
    o = torch.einsum("hkv,hk->hv", S, qh / d_k ** 0.5)
    return o, S
