"""statecache.torch.gdn_gates against the gate math of vLLM's packed decode
kernel (fused_recurrent_gated_delta_rule_packed_decode_kernel): g in fp32,
beta = sigmoid(b) rounded to b's dtype before the recurrence uses it."""
import torch

import statecache.torch as sct


def _inputs(dtype):
    gen = torch.Generator().manual_seed(3)
    a = (4 * torch.randn(64, 8, generator=gen)).to(dtype)
    b = (4 * torch.randn(64, 8, generator=gen)).to(dtype)
    A_log = torch.log(1 + 15 * torch.rand(8, generator=gen))
    dt_bias = torch.randn(8, generator=gen)
    return a, b, A_log, dt_bias


def test_bf16_beta_is_rounded_like_vllms_kernel():
    a, b, A_log, dt_bias = _inputs(torch.bfloat16)
    g, beta = sct.gdn_gates(a, b, A_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32
    want_beta = torch.sigmoid(b.float()).to(torch.bfloat16).float()
    assert torch.equal(beta, want_beta)
    assert torch.equal(beta.to(torch.bfloat16).float(), beta)   # a bf16 value
    assert not torch.equal(beta, torch.sigmoid(b.float()))       # the rounding matters
    x = a.float() + dt_bias
    assert torch.equal(g, -torch.exp(A_log) * torch.nn.functional.softplus(x))
    # vLLM's kernel spells softplus log(1 + exp(x)) (x <= 20), which loses the
    # low bits log1p keeps where exp(x) is small: equal to ~1e-6 absolute (and an
    # ulp relative where |g| is large).
    vllm_softplus = torch.where(x <= 20.0, torch.log(1.0 + torch.exp(x)), x)
    torch.testing.assert_close(g, -torch.exp(A_log) * vllm_softplus, rtol=1e-6, atol=2e-6)


def test_fp32_beta_is_not_rounded():
    a, b, A_log, dt_bias = _inputs(torch.float32)
    _, beta = sct.gdn_gates(a, b, A_log, dt_bias)
    assert torch.equal(beta, torch.sigmoid(b))
