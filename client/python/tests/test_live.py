"""Every RPC against a real statecached (CPU backend, loopback, ephemeral port)."""
import threading

import numpy as np
import pytest

import statecache as sc
from conftest import Server

GEOM = sc.Geometry("gdn", layers=2, h_qk=2, h_v=4, d_k=128, d_v=128)


def unit(rng, *shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def inputs(rng, b, geom=GEOM):
    q = unit(rng, b, geom.h_qk, geom.d_k)
    k = unit(rng, b, geom.h_qk, geom.d_k)
    v = rng.standard_normal((b, geom.h_v, geom.d_v)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (b, geom.h_v)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (b, geom.h_v)).astype(np.float32)
    return q, k, v, g, beta


def reference_step(S, q, k, v, g, beta, geom=GEOM):
    """FP32 GDN step (DESIGN.md section 2). S: [B, h_v, d_k, d_v], updated in place."""
    B = S.shape[0]
    group = geom.h_v // geom.h_qk
    scale = 1.0 / np.sqrt(geom.d_k)
    o = np.zeros((B, geom.h_v, geom.d_v), np.float32)
    for b in range(B):
        for h in range(geom.h_v):
            kh, qh = k[b, h // group], q[b, h // group]
            Sb = np.exp(g[b, h]) * S[b, h]
            delta = v[b, h] - Sb.T @ kh
            S[b, h] = Sb + beta[b, h] * np.outer(kh, delta)
            o[b, h] = S[b, h].T @ (scale * qh)
    return o


@pytest.fixture(scope="module")
def model(client):
    info = client.register_model("fp32m", GEOM, "fp32", slots=16, checkpoints=8)
    yield info
    client.drop_model("fp32m", force=True)


def test_health_and_register(client, model):
    assert client.health() and client.health("statecache.v1.StateCache")
    assert model.model_id == "fp32m" and model.format == "fp32"
    assert model.geometry == GEOM
    assert model.slot_bytes == GEOM.layers * GEOM.h_v * 128 * 128 * 4 == model.fp32_slot_bytes
    assert model.head_bytes.total == 65536 and model.payload_bits_per_value == 32.0
    assert model.tags.model_id == "fp32m" and model.tags.slot_bytes == model.slot_bytes
    assert model.stats.slot_capacity == 16 and model.stats.checkpoint_capacity == 8
    assert client.describe_model("fp32m") == client.describe_model("fp32m")
    assert "fp32m" in [m.model_id for m in client.list_models()]
    with pytest.raises(sc.AlreadyExists):
        client.register_model("fp32m", GEOM, "fp32", slots=1, checkpoints=0)
    with pytest.raises(sc.InvalidArgument, match="format"):
        client.register_model("bad", GEOM, "int3", slots=1, checkpoints=0)
    with pytest.raises(sc.NotFound):
        client.describe_model("nope")


def test_damp_sizes(client):
    info = client.register_model("dampm", GEOM, "damp", slots=2, checkpoints=1)
    try:
        assert info.format == "damp:16"
        assert info.head_bytes == sc.HeadBytes(4096, 14336, 1792, 0, 20224)
        assert info.slot_bytes == 8 * 20224 and info.payload_bits_per_value == 9.875
        assert info.checkpoint_format == "damp:16"
        assert info.checkpoint_format_slot_bytes == info.slot_bytes
    finally:
        client.drop_model("dampm")


def test_checkpoint_format(client):
    info = client.register_model("coldm", GEOM, "damp", slots=1, checkpoints=1,
                                 checkpoint_format="int4-hadamard")
    try:
        assert info.format == "damp:16" and info.checkpoint_format == "int4-hadamard"
        # int4 codes + fp16 (s, z) per 32 values: 64 + 16 bytes per 128-value row.
        assert info.checkpoint_format_slot_bytes == 8 * 128 * 80
        assert info.stats.checkpoint_transcodes_to_cold == 0
    finally:
        client.drop_model("coldm")
    with pytest.raises(sc.InvalidArgument, match="checkpoint_format"):
        client.register_model("bad", GEOM, "damp", slots=1, checkpoints=0,
                              checkpoint_format="damp-sr")


def test_update_matches_numpy_reference(client, model):
    rng = np.random.default_rng(1)
    slots = client.allocate_slots("fp32m", 3)
    S = np.zeros((3, GEOM.h_v, 128, 128), np.float32)
    try:
        for step in range(5):
            q, k, v, g, beta = inputs(rng, 3)
            r = client.update("fp32m", 0, slots, q, k, v, g, beta)
            want = reference_step(S, q, k, v, g, beta)
            assert r.o.shape == (3, 4, 128) and r.o.dtype == np.float32
            np.testing.assert_allclose(r.o, want, rtol=1e-4, atol=1e-5)
            assert r.kernel_micros >= 0
        # fp16 inputs are accepted and give nearly the same readout
        q, k, v, g, beta = inputs(rng, 3)
        r16 = client.update("fp32m", 1, slots, q.astype(np.float16), k.astype(np.float16),
                            v.astype(np.float16), g, beta)
        assert r16.o.shape == (3, 4, 128)
    finally:
        client.release_slots("fp32m", slots)


def test_bf16_inputs_match_fp32_of_the_rounded_values(client, model):
    from statecache.tensor import bf16_bits
    rng = np.random.default_rng(8)
    slots = client.allocate_slots("fp32m", 2)
    try:
        q, k, v, g, beta = inputs(rng, 1)
        bits = [bf16_bits(x) for x in (q, k, v)]
        rounded = [(b.astype(np.uint32) << 16).view(np.float32) for b in bits]
        a = client.update("fp32m", 0, slots[:1], *bits, g, beta, dtype="bf16").o
        b = client.update("fp32m", 0, slots[1:], *rounded, g, beta).o
        np.testing.assert_array_equal(a, b)  # bf16 is widened exactly on the server
        with pytest.raises(sc.InvalidArgument, match="q: array of uint16 cannot be sent as fp16"):
            client.update("fp32m", 0, slots[:1], *bits, g, beta, dtype="fp16")
    finally:
        client.release_slots("fp32m", slots)


def test_update_errors(client, model):
    rng = np.random.default_rng(2)
    slots = client.allocate_slots("fp32m", 2)
    q, k, v, g, beta = inputs(rng, 2)
    with pytest.raises(sc.InvalidArgument, match="layer"):
        client.update("fp32m", 7, slots, q, k, v, g, beta)
    with pytest.raises(sc.InvalidArgument, match="v"):
        client.update("fp32m", 0, slots, q, k, v[:, :3], g, beta)
    bad = v.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(sc.InvalidArgument):
        client.update("fp32m", 0, slots, q, k, bad, g, beta)
    with pytest.raises(sc.NotFound):
        client.update("fp32m", 0, [sc.SlotHandle(12345, 1), slots[1]], q, k, v, g, beta)
    with pytest.raises(sc.NotFound):
        client.update("nope", 0, slots, q, k, v, g, beta)
    client.release_slots("fp32m", slots)
    with pytest.raises(sc.FailedPrecondition):  # stale handle
        client.update("fp32m", 0, slots, q, k, v, g, beta)
    with pytest.raises(sc.ResourceExhausted):
        client.allocate_slots("fp32m", 17)


def test_update_stream_pipelined_and_errors_continue(client, model):
    rng = np.random.default_rng(3)
    slots = client.allocate_slots("fp32m", 2)
    S = np.zeros((2, GEOM.h_v, 128, 128), np.float32)
    try:
        with client.update_stream("fp32m") as s:
            steps = [inputs(rng, 2) for _ in range(4)]
            seqs = [s.send(0, slots, *x) for x in steps]
            for seq, x in zip(seqs, steps):
                r = s.recv()
                assert r.sequence == seq
                np.testing.assert_allclose(r.o, reference_step(S, *x), rtol=1e-4, atol=1e-5)
            with pytest.raises(sc.InvalidArgument, match=r"UpdateStream\[seq=4\].*layer"):
                s.update(9, slots, *inputs(rng, 2))
            x = inputs(rng, 2)
            r = s.update(0, slots, *x)  # the stream goes on after a failed message
            assert r.sequence == 5
            np.testing.assert_allclose(r.o, reference_step(S, *x), rtol=1e-4, atol=1e-5)
    finally:
        client.release_slots("fp32m", slots)


def test_prefill_tokens_equals_updates(client, model):
    rng = np.random.default_rng(4)
    slots = client.allocate_slots("fp32m", 2)
    try:
        T = 6
        steps = [inputs(rng, 1) for _ in range(T)]
        stack = [np.stack([s[i][0] for s in steps])[None] for i in range(5)]  # [1, T, ...]
        p = client.prefill("fp32m", slots[:1], 0, *stack, want_output=True)
        assert p.o.shape == (1, T, 4, 128)
        for t, x in enumerate(steps):
            o = client.update("fp32m", 0, slots[1:], *x).o
            np.testing.assert_allclose(p.o[0, t], o[0], rtol=1e-4, atol=1e-5)
        nout = client.prefill("fp32m", slots[:1], 1, *stack)
        assert nout.o is None
    finally:
        client.release_slots("fp32m", slots)


def test_prefill_states_export_import(client, model):
    rng = np.random.default_rng(5)
    slots = client.allocate_slots("fp32m", 2)
    try:
        states = (0.1 * rng.standard_normal((1, 2, 4, 128, 128))).astype(np.float32)
        client.prefill_states("fp32m", slots[:1], states)
        exp = client.export_state("fp32m", slots[0])
        assert len(exp.packed) == exp.tags.slot_bytes
        # fp32 packed bytes are the states themselves (identity layout)
        np.testing.assert_array_equal(np.frombuffer(exp.packed, np.float32),
                                      states.ravel())
        client.import_state("fp32m", slots[1], exp)
        x = inputs(rng, 1)
        a = client.update("fp32m", 0, slots[:1], *x).o
        b = client.update("fp32m", 0, slots[1:], *x).o
        np.testing.assert_array_equal(a, b)
        wrong = sc.ExportedState(sc.CompatibilityTags(
            "other", exp.tags.format, exp.tags.layout_fingerprint, exp.tags.geometry,
            exp.tags.slot_bytes, exp.tags.format_version), exp.packed)
        with pytest.raises(sc.FailedPrecondition, match="model_id"):
            client.import_state("fp32m", slots[1], wrong)
    finally:
        client.release_slots("fp32m", slots)


def test_unpack_is_the_inverse_of_prefill_states(client, model):
    rng = np.random.default_rng(9)
    slots = client.allocate_slots("fp32m", 1)
    try:
        states = rng.standard_normal((1, 2, 4, 128, 128)).astype(np.float32)
        client.prefill_states("fp32m", slots, states)
        back = client.unpack("fp32m", slots[0])
        assert back.dtype == np.float32
        np.testing.assert_array_equal(back, states.ravel())
        stale = sc.SlotHandle(slots[0].id, slots[0].generation + 1)
        with pytest.raises(sc.FailedPrecondition):
            client.unpack("fp32m", stale)
        with pytest.raises(sc.NotFound):
            client.unpack("fp32m", sc.SlotHandle(slots[0].id ^ 0xdeadbeef, slots[0].generation))
    finally:
        client.release_slots("fp32m", slots)


def test_unpack_checkpoint_equals_the_slot_at_snapshot_time(client, model):
    rng = np.random.default_rng(10)
    slots = client.allocate_slots("fp32m", 1)
    try:
        states = rng.standard_normal((1, 2, 4, 128, 128)).astype(np.float32)
        client.prefill_states("fp32m", slots, states)
        before = client.unpack("fp32m", slots[0])
        tokens = [3, 1, 4, 1, 5]
        snap = client.snapshot("fp32m", slots[0], tokens=tokens, key_kind=sc.KEY_SHA256)
        client.prefill_states("fp32m", slots, states * 2)  # the slot moves on
        ckpt = client.unpack_checkpoint("fp32m", snap.key)
        assert ckpt.dtype == np.float32
        assert ckpt.tobytes() == before.tobytes()  # bit for bit (fp32)
        hit = client.lookup_prefix("fp32m", keys=[snap.key], lease_ms=5000)
        assert hit.hit and hit.lease_id != 0
        np.testing.assert_array_equal(
            client.unpack_checkpoint("fp32m", snap.key, hit.lease_id), before)
        client.release_lease("fp32m", hit.lease_id)  # not consumed by the unpack
        missing = sc.PrefixKey(0, 5, sc.KEY_SHA256, b"\x07" * 32)
        with pytest.raises(sc.NotFound, match="key"):
            client.unpack_checkpoint("fp32m", missing)
        with pytest.raises(sc.InvalidArgument, match="lease_id"):
            client.unpack_checkpoint("fp32m", snap.key, -1)
    finally:
        client.release_slots("fp32m", slots)


def test_snapshot_lookup_restore(client, model):
    rng = np.random.default_rng(6)
    slots = client.allocate_slots("fp32m", 2)
    try:
        for _ in range(3):
            client.update("fp32m", 0, slots[:1], *inputs(rng, 1))
        tokens = [101, 7, 7, 42]
        aux = [b"conv-window-0", b"conv-window-1"]
        snap = client.snapshot("fp32m", slots[0], tokens=tokens, aux=aux)
        assert snap.key == sc.prefix_hash(tokens)  # client hash == server hash
        hit = client.lookup_prefix("fp32m", tokens=tokens + [5, 6])
        assert hit.hit and hit.key == snap.key and hit.lease_id != 0
        assert hit.candidate_tokens == 6
        r = client.restore("fp32m", slots[1], hit.key, hit.lease_id)
        assert r.aux == aux and r.num_tokens == 4
        x = inputs(rng, 1)
        np.testing.assert_array_equal(client.update("fp32m", 0, slots[:1], *x).o,
                                      client.update("fp32m", 0, slots[1:], *x).o)
        by_keys = client.lookup_prefix("fp32m", keys=sc.prefix_keys(tokens + [9]))
        assert by_keys.hit and by_keys.key.num_tokens == 4
        miss = client.lookup_prefix("fp32m", tokens=[999])
        assert not miss.hit and miss.key is None
        with pytest.raises(sc.NotFound):
            client.restore("fp32m", slots[1], sc.PrefixKey(1, 1))
        stats = client.get_stats("fp32m").model("fp32m").stats
        assert stats.snapshots >= 1 and stats.restores >= 1
        assert stats.lookups_hit >= 2 and stats.lookups_miss >= 1
        assert 0 < stats.hit_rate < 1
    finally:
        client.release_slots("fp32m", slots)


def test_get_stats(client, model):
    s = client.get_stats()
    assert s.backend == "cpu" and s.uptime_seconds > 0
    assert s.state_memory_budget_bytes == 64 << 20
    e = s.model("fp32m")
    assert e is not None and e.format == "fp32"
    assert e.stats.slot_capacity == 16


def test_concurrent_clients_on_distinct_slots(client, model):
    rng = np.random.default_rng(7)
    slots = client.allocate_slots("fp32m", 4)
    xs = [[inputs(rng, 1) for _ in range(5)] for _ in slots]
    results, errors = {}, []

    def run(i):
        try:
            with sc.Client(client.target, timeout=30) as c:
                results[i] = [c.update("fp32m", 0, [slots[i]], *x).o.copy() for x in xs[i]]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    for i in range(4):
        S = np.zeros((1, GEOM.h_v, 128, 128), np.float32)
        for x, o in zip(xs[i], results[i]):
            np.testing.assert_allclose(o, reference_step(S, *x), rtol=1e-4, atol=1e-5)
    client.release_slots("fp32m", slots)


def test_sharded_client_routes_by_conversation(statecached_binary):
    servers = [Server(statecached_binary, ["--metrics_port=-1"]) for _ in range(3)]
    try:
        with sc.ShardedClient([s.target for s in servers], timeout=30) as cluster:
            infos = cluster.register_model_everywhere("m", GEOM, "damp", slots=32, checkpoints=8)
            assert len(infos) == 3
            assert cluster.register_model_everywhere("m", GEOM, "damp", slots=32, checkpoints=8)  # exist_ok
            convs = [f"conversation-{i}" for i in range(30)]
            for conv in convs:
                c = cluster.for_conversation(conv)
                assert c.target == cluster.ring.route(conv)
                c.allocate_slots("m", 1)
            per_server = {e: st.model("m").stats.slots_allocated
                          for e, st in cluster.stats().items()}
            want = {e: sum(cluster.endpoint_for(c) == e for c in convs) for e in cluster.endpoints}
            assert per_server == want
            assert sum(per_server.values()) == 30 and min(per_server.values()) > 0
            with pytest.raises(sc.InvalidArgument, match="not in the ring"):
                cluster.client("127.0.0.1:1")
    finally:
        for s in servers:
            s.stop()
