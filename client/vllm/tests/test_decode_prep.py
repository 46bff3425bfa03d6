"""decode_prep's Triton kernel (Triton's interpreter on the CPU: conftest sets
TRITON_INTERPRET=1) against step.decode's torch path: the same q, k, v, g,
beta up to the two spellings' last bits (x / sqrt vs x * rsqrt, log(1 +
exp) vs log1p), beta rounded to b's dtype, fresh rows reset exactly."""
import pytest
import torch

import statecache.torch as sct
from statecache_vllm.decode_prep import decode_prep, zero_fresh_rows
from statecache_vllm.step import RESET_G

H, HV, K, V = 2, 4, 32, 48


def _inputs(n, dtype=torch.bfloat16, extra=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = 2 * H * K + HV * V + extra       # a wider row: x may be a view of a larger buffer
    x = (3 * torch.randn(n, width, generator=gen)).to(dtype)
    a = (4 * torch.randn(n, HV, generator=gen)).to(dtype)
    b = (4 * torch.randn(n, HV, generator=gen)).to(dtype)
    A_log = torch.log(1 + 15 * torch.rand(HV, generator=gen))
    dt_bias = torch.randn(HV, generator=gen)
    fresh = torch.tensor([i % 3 == 1 for i in range(n)])
    return x, a, b, A_log, dt_bias, fresh


def _torch_path(x, a, b, A_log, dt_bias, fresh):
    n, kd = x.shape[0], H * K
    q = sct.l2_normalize(x[:, :kd].reshape(n, H, K).float())
    k = sct.l2_normalize(x[:, kd:2 * kd].reshape(n, H, K).float())
    v = x[:, 2 * kd:2 * kd + HV * V].reshape(n, HV, V).float()
    g, beta = sct.gdn_gates(a, b, A_log, dt_bias)
    g = torch.where(fresh.view(-1, 1), torch.full_like(g, RESET_G), g)
    return q, k, v, g, beta


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_the_torch_path(dtype):
    args = _inputs(7, dtype)
    got = decode_prep(*args, h_qk=H, d_k=K, h_v=HV, d_v=V)
    want = _torch_path(*args)
    for name, x, y in zip(("q", "k", "v", "g", "beta"), got, want):
        assert x.dtype == torch.float32 and x.is_contiguous() and x.shape == y.shape, name
    q, k, v, g, beta = got
    torch.testing.assert_close(q, want[0], rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(k, want[1], rtol=2e-6, atol=1e-7)
    assert torch.equal(v, want[2])
    if dtype == torch.bfloat16:
        # Rounded to b's dtype (every value a bf16); the interpreter's fp32 ->
        # bf16 conversion truncates where the GPU's (cvt.rn) and torch round to
        # nearest, so the values agree to one bf16 ulp here, bit for bit there.
        assert torch.equal(beta.to(torch.bfloat16).float(), beta)
        torch.testing.assert_close(beta, want[4], rtol=2 ** -7, atol=0)
    else:
        torch.testing.assert_close(beta, want[4], rtol=1e-6, atol=1e-7)
    fresh = args[5]
    assert torch.equal(g[fresh], torch.full_like(g[fresh], RESET_G))
    torch.testing.assert_close(g[~fresh], want[3][~fresh], rtol=1e-6, atol=2e-6)
    assert torch.allclose(q.norm(dim=-1), torch.ones(7, H), atol=1e-5)


def test_without_fresh_and_empty():
    x, a, b, A_log, dt_bias, _ = _inputs(3)
    _, _, _, g, _ = decode_prep(x, a, b, A_log, dt_bias, None, h_qk=H, d_k=K, h_v=HV, d_v=V)
    assert bool((g < 0).all()) and bool((g > -1e29).all())
    out = decode_prep(x[:0], a[:0], b[:0], A_log, dt_bias, None, h_qk=H, d_k=K, h_v=HV, d_v=V)
    assert [t.shape[0] for t in out] == [0] * 5


def test_shape_errors_name_the_argument():
    x, a, b, A_log, dt_bias, fresh = _inputs(3)
    with pytest.raises(ValueError, match=r"^x: shape \[3, 10\]"):
        decode_prep(x[:, :10], a, b, A_log, dt_bias, fresh, h_qk=H, d_k=K, h_v=HV, d_v=V)
    with pytest.raises(ValueError, match=r"^b: shape \[3, 3\]"):
        decode_prep(x, a, b[:, :3], A_log, dt_bias, fresh, h_qk=H, d_k=K, h_v=HV, d_v=V)
    with pytest.raises(ValueError, match=r"^fresh: shape \[2\]"):
        decode_prep(x, a, b, A_log, dt_bias, fresh[:2], h_qk=H, d_k=K, h_v=HV, d_v=V)


def _pages(blocks, state_bytes, fill=0xFF):
    """vLLM-like pages: [blocks, page] with the state at an offset; 0xFF bytes
    decode to NaN in every FP format (the case RESET_G alone cannot clear)."""
    pages = torch.full((blocks, state_bytes + 96), fill, dtype=torch.uint8)
    return pages, pages[:, 32:32 + state_bytes]


def test_fresh_rows_state_bytes_are_zeroed_and_nothing_else():
    x, a, b, A_log, dt_bias, fresh = _inputs(7)   # rows 1 and 4 fresh
    state_bytes = HV * 256
    pages, rows = _pages(6, state_bytes)
    slots = torch.tensor([0, 3, 1, 2, -1, 4, 5], dtype=torch.int32)
    fresh[4] = True      # a fresh padding row writes nothing
    before = pages.clone()
    got = decode_prep(x, a, b, A_log, dt_bias, fresh, h_qk=H, d_k=K, h_v=HV, d_v=V,
                      rows=rows, slots=slots)
    want = decode_prep(x, a, b, A_log, dt_bias, fresh, h_qk=H, d_k=K, h_v=HV, d_v=V)
    for x_, y_ in zip(got, want):
        assert torch.equal(x_, y_)
    assert not rows[3].any()                     # row 1's slot
    changed = (pages != before).any(dim=1)
    assert changed.tolist() == [False, False, False, True, False, False]
    assert (pages[3, :32] == 0xFF).all() and (pages[3, 32 + state_bytes:] == 0xFF).all()


def test_zero_fresh_rows_alone():
    pages, rows = _pages(5, HV * 128)
    before = pages.clone()
    zero_fresh_rows(rows, torch.tensor([4, 0, -1, 2], dtype=torch.int32),
                    torch.tensor([True, False, True, True]), HV)
    assert not rows[4].any() and not rows[2].any()
    assert torch.equal(pages[[0, 1, 3]], before[[0, 1, 3]])
    assert (pages[:, :32] == 0xFF).all() and (pages[:, 32 + HV * 128:] == 0xFF).all()
    with pytest.raises(ValueError, match="^rows: "):
        zero_fresh_rows(rows.float(), torch.tensor([0], dtype=torch.int32),
                        torch.tensor([True]), HV)
    with pytest.raises(ValueError, match="^slots: "):
        zero_fresh_rows(rows, torch.tensor([0, 1]), torch.tensor([True, True]), HV)
