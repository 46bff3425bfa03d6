"""PoolManager and the step functions on a real statecached (CPU backend,
started by the plugin's spawn path), against the float64 reference."""
import warnings

import pytest
import torch

import statecache as sc
from gdn_reference import l2n, token
from statecache_vllm import step
from statecache_vllm.config import parse, parse_format
from statecache_vllm.layout import head_bytes, rank_geometry
from statecache_vllm.pool import PagePools, PoolError, PoolManager, SpawnedServer

GEO = rank_geometry(2, 4, 128, 128, 1)
CPU = torch.device("cpu")


def _open(paths, fmt="fp32", num_blocks=6, layers=2, **kw):
    cfg = parse({"format": fmt, "storage": "server", "statecached": paths["statecached"],
                 "check_every": 2, **kw})
    return PoolManager.open(cfg, geometry=GEO, layers=layers, num_blocks=num_blocks,
                            tp_size=1, rank=0, device=CPU, environ={})


def _inputs(n, t=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lead = (n,) if t is None else (n, t)
    q = torch.randn(lead + (GEO.h_qk, GEO.d_k), generator=gen)
    k = torch.randn(lead + (GEO.h_qk, GEO.d_k), generator=gen)
    v = torch.randn(lead + (GEO.h_v, GEO.d_v), generator=gen)
    g = -0.5 * torch.rand(lead + (GEO.h_v,), generator=gen)
    beta = 0.2 + 0.6 * torch.rand(lead + (GEO.h_v,), generator=gen)
    return q, k, v, g, beta


def test_head_bytes_match_the_server(paths, tmp_path):
    """statecache_vllm.layout's sizes equal what statecached registers."""
    server = SpawnedServer(paths["statecached"], backend="cpu", state_bytes=64 << 20,
                           physical_device=None, extra_args=(), environ={})
    try:
        with sc.Client(server.target, timeout=30) as c:
            for i, fmt in enumerate(["fp32", "fp16", "bf16", "int8", "int8-hadamard", "int4",
                                     "int4-hadamard", "fp8-e4m3", "nvfp4", "damp:16", "damp:3",
                                     "damp-sr:16"]):
                geo = sc.Geometry("gdn", layers=1, h_qk=1, h_v=1, d_k=64, d_v=96)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", sc.IdentityLayoutWarning)
                    info = c.register_model(f"m{i}", geo, fmt, slots=1, checkpoints=1)
                assert info.head_bytes.total == head_bytes(parse_format(fmt), 64, 96), fmt
    finally:
        server.stop()


def test_table_lookup_and_close(paths):
    pm = _open(paths, num_blocks=6)
    try:
        t = pm.table.tolist()
        assert t[0] == -1 and len(t) == 6 and sorted(t[1:]) == sorted(set(t[1:]))
        assert min(t[1:]) >= 0
        assert pm.shape.slots == 5 and pm.shape.slot_bytes == 2 * 4 * 65536
        ids = torch.tensor([0, 3, -1, 5, 1], dtype=torch.int64)
        assert pm.lookup(ids).tolist() == [-1, t[3], -1, t[5], t[1]]
        out = torch.empty(5, dtype=torch.int32)
        assert pm.lookup(ids, out=out).data_ptr() == out.data_ptr()
    finally:
        pm.close()
    assert pm.server.proc.poll() is not None  # the spawned server is gone


def test_decode_matches_reference_with_padding_and_reset(paths):
    pm = _open(paths, num_blocks=6)
    try:
        slots = pm.lookup(torch.tensor([1, 2, 0]))       # row 2: padding (null block)
        S = [torch.zeros(GEO.h_v, GEO.d_k, GEO.d_v, dtype=torch.float64) for _ in range(2)]
        for t in range(3):
            q, k, v, g, beta = _inputs(3, seed=t)
            fresh = torch.tensor([t == 0, t == 2, False])  # row 1 restarts at step 2
            o = step.decode(pm.pool, 1, slots, q, k, v, g, beta, fresh=fresh, record=pm.record)
            pm.check()
            assert o.dtype == torch.float32 and o.shape == (3, GEO.h_v, GEO.d_v)
            assert torch.equal(o[2], torch.zeros_like(o[2]))
            for r in range(2):
                if fresh[r]:
                    S[r] = torch.zeros_like(S[r])
                want, S[r] = token(S[r], l2n(q[r]), l2n(k[r]), v[r], g[r], beta[r])
                torch.testing.assert_close(o[r].double(), want, rtol=1e-4, atol=1e-5)
        # q = k = v = 0, g = 0, beta = 0 (prefill's padding tokens): o = 0
        z = [x[:, :1].clone() for x in _inputs(2, 1)]
        z[4].zero_()
        z[3].zero_()
        z[0].zero_()
        z[1].zero_()
        z[2].zero_()
        plan = step.prefill_plan(torch.tensor([0, 1, 2]))
        o = step.prefill(pm.pool, 0, slots[:2], plan, plan.pos, None, z[0][:, 0], z[1][:, 0],
                         z[2][:, 0], z[3][:, 0], z[4][:, 0], record=pm.record)
        pm.check()
        assert torch.count_nonzero(o) == 0
    finally:
        pm.close()


def test_prefill_varlen_then_decode(paths):
    pm = _open(paths, num_blocks=6)
    try:
        slots = pm.lookup(torch.tensor([3, 4, 5]))
        lens = [3, 1, 4]
        qsl = torch.tensor([0, 3, 4, 8])
        plan = step.prefill_plan(qsl)
        assert (plan.rows, plan.tokens) == (3, 4)
        assert plan.pos.tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
        q, k, v, g, beta = _inputs(8, seed=5)
        qn, kn = l2n(q).float(), l2n(k).float()
        fresh = torch.tensor([True, True, True])
        o = step.prefill(pm.pool, 1, slots, plan, plan.pos, fresh, qn, kn, v, g, beta,
                         record=pm.record)
        pm.check()
        assert o.shape == (8, GEO.h_v, GEO.d_v)
        S = []
        for r in range(3):
            s = torch.zeros(GEO.h_v, GEO.d_k, GEO.d_v, dtype=torch.float64)
            for i in range(int(qsl[r]), int(qsl[r + 1])):
                want, s = token(s, qn[i], kn[i], v[i], g[i], beta[i])
                torch.testing.assert_close(o[i].double(), want, rtol=1e-4, atol=1e-5)
            S.append(s)
        # second chunk of row 0 (has an initial state) and one decode of row 2
        q2, k2, v2, g2, b2 = _inputs(2, seed=9)
        plan2 = step.prefill_plan(torch.tensor([0, 2]))
        o2 = step.prefill(pm.pool, 1, slots[:1], plan2, plan2.pos, torch.tensor([False]),
                          l2n(q2).float(), l2n(k2).float(), v2, g2, b2, record=pm.record)
        s = S[0]
        for i in range(2):
            want, s = token(s, l2n(q2[i]), l2n(k2[i]), v2[i], g2[i], b2[i])
            torch.testing.assert_close(o2[i].double(), want, rtol=1e-4, atol=1e-5)
        q3, k3, v3, g3, b3 = _inputs(1, seed=11)
        o3 = step.decode(pm.pool, 1, slots[2:], q3, k3, v3, g3, b3, record=pm.record)
        pm.check()
        want, _ = token(S[2], l2n(q3[0]), l2n(k3[0]), v3[0], g3[0], b3[0])
        torch.testing.assert_close(o3[0].double(), want, rtol=1e-4, atol=1e-5)
    finally:
        pm.close()


def test_damp_close_to_reference(paths):
    pm = _open(paths, fmt="damp:16", num_blocks=3)
    try:
        slots = pm.lookup(torch.tensor([1, 2]))
        S = [torch.zeros(GEO.h_v, GEO.d_k, GEO.d_v, dtype=torch.float64) for _ in range(2)]
        err = ref = 0.0
        for t in range(8):
            q, k, v, g, beta = _inputs(2, seed=20 + t)
            o = step.decode(pm.pool, 0, slots, q, k, v, g, beta, record=pm.record)
            for r in range(2):
                want, S[r] = token(S[r], l2n(q[r]), l2n(k[r]), v[r], g[r], beta[r])
                err += float(((o[r].double() - want) ** 2).sum())
                ref += float((want ** 2).sum())
        pm.check()
        rrmse = (err / ref) ** 0.5
        assert 0 < rrmse < 0.05, rrmse   # quantized (not fp32-exact), but close
    finally:
        pm.close()


def test_record_check_every_and_errors(paths):
    pm = _open(paths, num_blocks=3)
    try:
        slots = pm.lookup(torch.tensor([1]))
        q, k, v, g, beta = _inputs(1)
        g = g.abs() + 0.1                      # g > 0: the op records, writes nothing
        step.decode(pm.pool, 0, slots, q, k, v, g, beta, record=pm.record)
        pm.step(capturing=True)                 # never checks while capturing
        pm.step(capturing=False)                # step 1 of check_every=2: no check yet
        with pytest.raises(sc.InvalidArgument, match="decode layer 0: g"):
            pm.step(capturing=False)
        pm.check()                              # the check reset the record
        with pytest.raises(sc.InvalidArgument, match="q: shape"):
            step.decode(pm.pool, 0, slots, q[:, :1], k, v, g, beta, record=pm.record)
    finally:
        pm.close()


def test_more_blocks_than_one_allocate_call(paths):
    """num_blocks above statecached's 4096 slots per AllocateSlots call."""
    geo = rank_geometry(1, 1, 32, 32, 1)
    cfg = parse({"format": "fp16", "storage": "server", "statecached": paths["statecached"]})
    pm = PoolManager.open(cfg, geometry=geo, layers=1, num_blocks=5000, tp_size=1, rank=0,
                          device=CPU, environ={})
    try:
        t = pm.table.tolist()
        assert len(pm.handles) == 4999 and t[0] == -1 and len(set(t[1:])) == 4999
        assert pm.shape.pool_bytes == 4999 * 2048
    finally:
        pm.close()


def test_spawned_server_holds_a_slot_over_one_mib(paths):
    """RegisterModel reserves one checkpoint of a slot: the spawned server's
    checkpoint budget must hold it (Qwen3.6 geometry: 6.47 MB in damp:16)."""
    pm = _open(paths, num_blocks=3, layers=5)   # fp32: 5 x 4 heads x 64 KiB = 1.25 MiB a slot
    try:
        assert pm.shape.slot_bytes == 5 * 4 * 65536 > 1 << 20
        assert pm.shape.slots == 2
    finally:
        pm.close()


def test_open_errors_name_the_step(paths):
    cfg = parse({"storage": "server", "target": "unix:/nonexistent/sc.sock", "format": "fp32"})
    with pytest.raises(PoolError, match="statecache pool for vllm-gdn.tp1.r0 at "
                                        "unix:/nonexistent/sc.sock"):
        PoolManager.open(cfg, geometry=GEO, layers=1, num_blocks=3, tp_size=1, rank=0,
                         device=CPU, environ={})
    bad = parse({"storage": "server", "statecached": "/nonexistent/statecached"})
    with pytest.raises(PoolError, match="statecached: cannot start"):
        PoolManager.open(bad, geometry=GEO, layers=1, num_blocks=3, tp_size=1, rank=0,
                         device=CPU, environ={})


def test_page_pools_index_vllm_pages(paths):
    """"pages" storage: one local pool per state tensor over vLLM's page rows,
    slot = block id, the null block padding; errors name the tensor."""
    cfg = parse({"format": "damp:16", "library": paths["library"]})
    state = GEO.h_v * head_bytes(cfg.format, GEO.d_k, GEO.d_v)
    pages = [torch.zeros(5, state + 512, dtype=torch.uint8) for _ in range(2)]
    store = PagePools.open(cfg, geometry=GEO, tensors=[p[:, 256:256 + state] for p in pages],
                           device=CPU)
    try:
        assert store.server is None and len(store.pools) == 2
        assert store.shape.slots == 5 and store.shape.slot_bytes == 2 * state
        assert store.lookup(torch.tensor([0, 3, -1, 4])).tolist() == [-1, 3, -1, 4]
        pool, layer, record, rows = store.bind(1)
        assert pool is store.pools[1] and layer == 0 and record is store.record
        assert store.bind(0)[2] is record   # one record: a check is one wait
        assert rows.data_ptr() == pages[1].data_ptr() + 256 and rows.shape == (5, state)
        q, k, v, g, beta = _inputs(2, seed=3)
        o = step.decode(pool, layer, torch.tensor([4, -1], dtype=torch.int32), q, k, v, g, beta,
                        record=record)
        store.check()
        assert o[0].abs().sum() > 0 and not o[1].any()
        assert pages[1][4, 256:256 + state].any() and not pages[1][:, :256].any()
        assert not pages[1][:, 256 + state:].any() and not pages[0].any()
        bad_beta = beta.clone()
        bad_beta[1, 2] = 9.0     # a failure in the second pool lands in the shared record
        step.decode(pool, layer, torch.tensor([4, 2], dtype=torch.int32), q, k, v, g, bad_beta,
                    record=record)
        with pytest.raises(sc.InvalidArgument, match=r"beta\[6\]"):
            store.check()
        store.check()            # the check reset it
        with pytest.raises(PoolError, match="position: 2 outside"):
            store.bind(2)
    finally:
        store.close()
        store.close()   # idempotent
    with pytest.raises(PoolError, match=r"tensors\[1\]: 4 blocks"):
        PagePools.open(cfg, geometry=GEO, tensors=[pages[0][:, :state], pages[1][:4, :state]],
                       device=CPU)
    with pytest.raises(PoolError, match=r"tensors\[0\]: statecache cannot index"):
        PagePools.open(cfg, geometry=GEO, tensors=[pages[0][:, :state - 16]], device=CPU)
    with pytest.raises(PoolError, match=r"tensors\[0\]: on cpu"):
        PagePools.open(cfg, geometry=GEO, tensors=[pages[0][:, :state]],
                       device=torch.device("cuda", 0))


def test_page_pools_take_their_layer_of_a_calibrated_layout(paths, tmp_path):
    """layout_file with "pages": position j's pool takes layer j of the file,
    so it decodes exactly as layer j of a server pool registered with it."""
    from statecache.integrations._slots import TrajectoryRecorder
    geo2 = sc.Geometry("gdn", layers=2, h_qk=GEO.h_qk, h_v=GEO.h_v, d_k=GEO.d_k, d_v=GEO.d_v)
    rec = TrajectoryRecorder(geo2, "test")
    gen = torch.Generator().manual_seed(9)
    for layer in range(2):
        q = torch.randn(1, 96, GEO.h_qk, GEO.d_k, generator=gen)
        k = torch.nn.functional.normalize(torch.randn(1, 96, GEO.h_qk, GEO.d_k, generator=gen),
                                          dim=-1)
        v = torch.randn(1, 96, GEO.h_v, GEO.d_v, generator=gen) * (1 + layer)
        g = -0.3 * torch.rand(1, 96, GEO.h_v, generator=gen)
        beta = 0.2 + 0.6 * torch.rand(1, 96, GEO.h_v, generator=gen)
        rec.add(layer, q, k, v, g, beta)
    traj = str(tmp_path / "doc.safetensors")
    rec.write(traj, "test")
    server = _open(paths, fmt="damp:16", num_blocks=3, layers=2)
    try:
        result = server.client.calibrate(geo2, "damp:16", [traj])
        layout = tmp_path / "l.layout"
        layout.write_bytes(result.layout_file)
    finally:
        server.close()
    cfg = {"format": "damp:16", "layout_file": str(layout)}
    server = _open(paths, fmt="damp:16", num_blocks=3, layers=2, layout_file=str(layout))
    state = GEO.h_v * head_bytes(parse_format("damp:16"), GEO.d_k, GEO.d_v)
    pages = [torch.zeros(3, state, dtype=torch.uint8) for _ in range(2)]
    store = PagePools.open(parse(cfg), geometry=GEO, tensors=pages, device=CPU)
    identity = PagePools.open(parse({"format": "damp:16"}), geometry=GEO,
                              tensors=[torch.zeros(3, state, dtype=torch.uint8)], device=CPU)
    try:
        outs = {}
        for name, (pool, layer, record) in {
                "server": (server.pool, 1, server.record),
                "pages": store.bind(1)[:3],
                "identity": identity.bind(0)[:3]}.items():
            slots = torch.tensor([1, 2], dtype=torch.int32) if name != "server" else \
                server.lookup(torch.tensor([1, 2]))
            for t in range(4):
                q, k, v, g, beta = _inputs(2, seed=40 + t)
                outs[name] = step.decode(pool, layer, slots, q, k, v, g, beta, record=record)
        store.check()
        server.check()
        assert torch.equal(outs["pages"], outs["server"])        # layer 1's maps, both sides
        assert not torch.equal(outs["pages"], outs["identity"])  # and they are not the identity
    finally:
        store.close()
        identity.close()
        server.close()


def test_prefill_with_needs_one_layer_pools(paths):
    """The runtime-kernel prefill packs whole slots: a pool of several layers
    is refused before anything runs."""
    pm = _open(paths, num_blocks=3, layers=2)
    try:
        q, k, v, g, beta = _inputs(2)
        with pytest.raises(ValueError, match="pool: 2 layers; prefill_with needs one layer"):
            step.prefill_with(lambda **kw: pytest.fail("the kernel ran"), pm.pool,
                              pm.lookup(torch.tensor([1])), None, q, k, v, g, beta,
                              record=pm.record)
    finally:
        pm.close()
