"""statecache.torch over engine-owned memory (EnginePool.local, no server) on
the CPU backend: the ops' math against a float64 GDN reference, bytes outside
the touched slots unchanged, padding and bad data recorded with nothing
written, and every argument error naming the argument. Runs in the torch venv
(run_torch_pytest.sh)."""
import pytest
import torch

import statecache as sc
import statecache.torch as sct
from statecache.errors import FailedPrecondition, InvalidArgument, NotFound, Unimplemented

GEO = sc.Geometry("gdn", layers=2, h_qk=1, h_v=2, d_k=32, d_v=32)


def reference_token(S, q, k, v, g, beta):
    """One GDN token in float64 (DESIGN.md section 2): S [h_v, d_k, d_v], q,
    k [h_qk, d_k], v [h_v, d_v], g, beta [h_v]; returns (o, S)."""
    rep = S.shape[0] // q.shape[0]
    qh, kh = q.double().repeat_interleave(rep, 0), k.double().repeat_interleave(rep, 0)
    Sb = torch.exp(g.double()).view(-1, 1, 1) * S
    delta = v.double() - torch.einsum("hkv,hk->hv", Sb, kh)
    S = Sb + beta.double().view(-1, 1, 1) * torch.einsum("hk,hv->hkv", kh, delta)
    return torch.einsum("hkv,hk->hv", S, qh / S.shape[1] ** 0.5), S


def token_inputs(n, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, GEO.h_qk, GEO.d_k, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(n, GEO.h_qk, GEO.d_k, generator=gen), dim=-1)
    v = torch.randn(n, GEO.h_v, GEO.d_v, generator=gen)
    g = -0.5 * torch.rand(n, GEO.h_v, generator=gen)
    beta = 0.2 + 0.6 * torch.rand(n, GEO.h_v, generator=gen)
    return q, k, v, g, beta


def test_slot_bytes_size_the_memory():
    fp32 = sct.EnginePool.slot_bytes(GEO, "fp32")
    assert fp32 == GEO.layers * GEO.h_v * GEO.d_k * GEO.d_v * 4
    assert sct.EnginePool.slot_bytes(GEO, "damp:16") < fp32 // 2  # d_k = 32: half the rows FP16


def test_decode_over_engine_memory_matches_the_reference():
    sb = sct.EnginePool.slot_bytes(GEO, "fp32")
    memory = torch.zeros(3 * sb + 64, dtype=torch.uint8)
    pool = sct.EnginePool.local(memory, GEO, "fp32")
    try:
        assert pool.num_slots == 3
        record = pool.new_record()
        gen = torch.Generator().manual_seed(1)
        states = 0.3 * torch.randn(2, GEO.layers, GEO.h_v, GEO.d_k, GEO.d_v, generator=gen)
        idx = torch.tensor([2, 0], dtype=torch.int32)
        sct.pack(pool, idx, states, record=record)
        q, k, v, g, beta = token_inputs(2, seed=2)
        o = sct.decode(pool, 1, idx, q, k, v, g, beta, record=record)
        pool.check(record)
        after = sct.unpack(pool, idx, record=record)
        pool.check(record)
        for row in range(2):
            want_o, want_S = reference_token(states[row, 1].double(), q[row], k[row], v[row],
                                             g[row], beta[row])
            torch.testing.assert_close(o[row].double(), want_o, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(after[row, 1].double(), want_S, atol=2e-5, rtol=1e-5)
            assert torch.equal(after[row, 0], states[row, 0])  # layer 0 untouched
        assert not memory[sb:2 * sb].any() and not memory[3 * sb:].any()  # slot 1, the tail
    finally:
        pool.close()


def test_padding_and_bad_data_write_nothing():
    sb = sct.EnginePool.slot_bytes(GEO, "damp:16")
    memory = torch.zeros(2 * sb, dtype=torch.uint8)
    pool = sct.EnginePool.local(memory, GEO, "damp:16")
    try:
        record = pool.new_record()
        gen = torch.Generator().manual_seed(3)
        states = 0.3 * torch.randn(2, GEO.layers, GEO.h_v, GEO.d_k, GEO.d_v, generator=gen)
        sct.pack(pool, torch.tensor([0, 1], dtype=torch.int32), states, record=record)
        pool.check(record)
        q, k, v, g, beta = token_inputs(2, seed=4)
        o = sct.decode(pool, 0, torch.tensor([-1, 1], dtype=torch.int32), q, k, v, g, beta,
                       record=record)
        pool.check(record)
        assert not o[0].any() and o[1].abs().sum() > 0  # the padding row is zero
        before = memory.clone()
        beta[1, 1] = 7.0
        sct.decode(pool, 0, torch.tensor([0, 1], dtype=torch.int32), q, k, v, g, beta,
                   record=record)
        with pytest.raises(InvalidArgument, match=r"beta\[3\]"):
            pool.check(record)
        assert torch.equal(memory, before)
    finally:
        pool.close()


def test_rows_of_engine_pages_hold_the_slots():
    """A [blocks, row] view inside bigger pages (vLLM's mamba pages): slot s
    is row s, the ops give a packed pool's bytes, the rest of every page is
    never touched."""
    sb = sct.EnginePool.slot_bytes(GEO, "damp:16")
    page, offset, n = sb + 96, 48, 3
    pages = torch.full((n, page), 0x5A, dtype=torch.uint8)
    rows = pages[:, offset:offset + sb + 16]   # a row longer than a slot, stride(0) = page
    packed_mem = torch.zeros(n * sb, dtype=torch.uint8)
    strided = sct.EnginePool.local(rows, GEO, "damp:16")
    packed = sct.EnginePool.local(packed_mem, GEO, "damp:16")
    try:
        assert strided.num_slots == n
        gen = torch.Generator().manual_seed(7)
        states = 0.3 * torch.randn(n, GEO.layers, GEO.h_v, GEO.d_k, GEO.d_v, generator=gen)
        idx = torch.tensor([2, 0, 1], dtype=torch.int32)
        q, k, v, g, beta = token_inputs(2, seed=8)
        outs = []
        for pool in (strided, packed):
            record = pool.new_record()
            sct.pack(pool, idx, states, record=record)
            outs.append(sct.decode(pool, 1, idx[:2], q, k, v, g, beta, record=record))
            sct.copy_slots(pool, torch.tensor([2], dtype=torch.int32),
                           torch.tensor([1], dtype=torch.int32), record=record)
            pool.check(record)
        assert torch.equal(outs[0], outs[1])
        for s in range(n):
            assert torch.equal(pages[s, offset:offset + sb], packed_mem[s * sb:(s + 1) * sb])
            assert (pages[s, :offset] == 0x5A).all() and (pages[s, offset + sb:] == 0x5A).all()
        with pytest.raises(InvalidArgument, match="holds no slot"):
            sct.EnginePool.local(pages[:, :sb - 16], GEO, "damp:16")
        with pytest.raises(InvalidArgument, match="slot_stride"):
            sct.EnginePool.local(torch.zeros(n, sb + 8, dtype=torch.uint8)[:, :sb], GEO,
                                 "damp:16")
    finally:
        strided.close()
        packed.close()


def test_argument_errors_name_the_argument(tmp_path):
    sb = sct.EnginePool.slot_bytes(GEO, "fp32")
    with pytest.raises(InvalidArgument, match="bytes"):
        sct.EnginePool.local(torch.zeros(sb - 1, dtype=torch.uint8), GEO, "fp32")
    with pytest.raises(InvalidArgument, match="memory: not contiguous"):
        sct.EnginePool.local(torch.zeros(4, sb, dtype=torch.uint8).t(), GEO, "fp32")
    with pytest.raises(InvalidArgument, match="base"):
        sct.EnginePool.local(torch.zeros(2 * sb, dtype=torch.uint8)[8:], GEO, "fp32")
    with pytest.raises(InvalidArgument, match="format"):
        sct.EnginePool.slot_bytes(GEO, "int7")
    with pytest.raises(InvalidArgument, match="geometry.arch"):
        sct.EnginePool.slot_bytes(sc.Geometry("mamba", 2, 1, 2, 32, 32), "fp32")
    with pytest.raises(InvalidArgument, match="d_v"):
        sct.EnginePool.slot_bytes(sc.Geometry("gdn", 2, 1, 2, 32, 48), "fp32")
    with pytest.raises(Unimplemented, match="format"):
        sct.EnginePool.slot_bytes(GEO, "stepquant-4")
    with pytest.raises(NotFound, match="missing"):
        sct.EnginePool.slot_bytes(GEO, "damp:16", layout_path=str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="layout_layer: set without"):
        sct.EnginePool.slot_bytes(GEO, "damp:16", layout_layer=0)
    with pytest.raises(InvalidArgument, match="layout_layer: -1"):
        sct.EnginePool.slot_bytes(GEO, "damp:16", layout_layer=-1)
    pool = sct.EnginePool.local(torch.zeros(2 * sb, dtype=torch.uint8), GEO, "fp32")
    with pytest.raises(FailedPrecondition, match="local pool"):
        pool.slot_indices([sc.SlotHandle(1, 1)])
    record = pool.new_record()
    pool.close()
    q, k, v, g, beta = token_inputs(1, seed=5)
    with pytest.raises(InvalidArgument, match="no open EnginePool"):
        sct.decode(pool, 0, torch.tensor([0], dtype=torch.int32), q, k, v, g, beta,
                   record=record)
