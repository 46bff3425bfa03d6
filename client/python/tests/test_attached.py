"""Attached mode from Python (statecache.attached, ctypes over
libstatecache_dataplane.so) against a live statecached --shared_pools on the
CPU backend: bit-identical to server-side Update, lease enforcement, errors
naming the field."""
import numpy as np
import pytest

import statecache as sc
from conftest import Server

attached = pytest.importorskip("statecache.attached")

GEOM = sc.Geometry("gdn", layers=2, h_qk=2, h_v=4, d_k=64, d_v=64)
B = 3


def _library():
    try:
        return attached.find_library()
    except FileNotFoundError as e:
        import os
        if os.environ.get("STATECACHE_REQUIRE_SERVER") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def shared_server(statecached_binary):
    s = Server(statecached_binary, ("--shared_pools",))
    yield s
    rc = s.stop()
    assert rc == 0, "statecached exited with %r:\n%s" % (rc, "".join(s.log))


@pytest.fixture(scope="module")
def shared_client(shared_server):
    c = sc.Client(shared_server.target, timeout=30)
    c.wait_ready(10)
    c.register_model("att", GEOM, "damp:8", slots=16, checkpoints=2)
    yield c
    c.close()


def unit(rng, *shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def step_inputs(rng):
    q = unit(rng, B, GEOM.h_qk, GEOM.d_k)
    k = unit(rng, B, GEOM.h_qk, GEOM.d_k)
    v = rng.standard_normal((B, GEOM.h_v, GEOM.d_v)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (B, GEOM.h_v)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (B, GEOM.h_v)).astype(np.float32)
    return q, k, v, g, beta


def test_attached_is_bit_identical_to_server_updates(shared_server, shared_client):
    lib = _library()
    c = shared_client
    served, mine = c.allocate_slots("att", B), c.allocate_slots("att", B)
    rng = np.random.default_rng(5)
    with attached.AttachedSession(shared_server.target, "att", mine, library=lib) as a:
        assert a.backend == "cpu"
        assert (a.geometry.layers, a.geometry.h_v, a.geometry.d_v) == (2, 4, 64)
        o = np.empty((B, GEOM.h_v, GEOM.d_v), np.float32)
        for _ in range(3):
            for layer in range(GEOM.layers):
                q, k, v, g, beta = step_inputs(rng)
                want = c.update("att", layer, served, q, k, v, g, beta).o
                a.decode_update(layer, q, k, v, g, beta, o)
                assert o.tobytes() == want.tobytes()
        # The server refuses its own calls on attached slots.
        with pytest.raises(sc.FailedPrecondition, match=r"slots\[0\]"):
            c.update("att", 0, mine, *step_inputs(rng))
        a.detach()
        with pytest.raises(sc.FailedPrecondition):
            a.decode_update(0, *step_inputs(rng), o)
    # Detached: the states the worker wrote are the server's.
    for s, m in zip(served, mine):
        assert c.export_state("att", m).packed == c.export_state("att", s).packed
    c.release_slots("att", served + mine)


def test_attached_errors_name_the_field(shared_server, shared_client):
    lib = _library()
    c = shared_client
    mine, other = c.allocate_slots("att", B), c.allocate_slots("att", 1)
    rng = np.random.default_rng(6)
    q, k, v, g, beta = step_inputs(rng)
    o = np.empty((B, GEOM.h_v, GEOM.d_v), np.float32)
    with attached.AttachedSession(shared_server.target, "att", mine, library=lib) as a:
        with pytest.raises(sc.InvalidArgument, match=r": v: shape"):
            a.decode_update(0, q, k, v[:, :2], g, beta, o)
        with pytest.raises(sc.InvalidArgument, match=r": g: dtype float64"):
            a.decode_update(0, q, k, v, g.astype(np.float64), beta, o)
        with pytest.raises(sc.InvalidArgument, match=r": o: not contiguous"):
            a.decode_update(0, q, k, v, g, beta, np.empty((B, GEOM.d_v, GEOM.h_v),
                                                          np.float32).transpose(0, 2, 1))
        # A slot this session holds no lease on.
        with pytest.raises(sc.FailedPrecondition, match=r"slots\[0\]: not attached"):
            a.decode_update(0, q[:1], k[:1], v[:1], g[:1], beta[:1], o[:1], slots=other)
        # Values are validated by the backend binding (nothing written).
        before = [c.export_state("att", s).packed for s in other]
        bad = g.copy()
        bad[1, 2] = 0.5  # log-decay must be <= 0
        with pytest.raises(sc.InvalidArgument, match=r": g"):
            a.decode_update(0, q, k, v, bad, beta, o)
        with pytest.raises(sc.InvalidArgument, match=r": layer"):
            a.decode_update(GEOM.layers, q, k, v, g, beta, o)
        a.decode_update(1, q, k, v, g, beta, o)  # still usable
        assert np.isfinite(o).all()
        assert [c.export_state("att", s).packed for s in other] == before
    # Unknown model: the server's NOT_FOUND, named.
    with pytest.raises(sc.NotFound, match="model"):
        attached.AttachedSession(shared_server.target, "nope", mine, library=lib)
    c.release_slots("att", mine + other)


def test_attach_needs_shared_pools(server):
    lib = _library()
    c = sc.Client(server.target, timeout=30)
    c.wait_ready(10)
    c.register_model("plain", GEOM, "damp:8", slots=4, checkpoints=0)
    slots = c.allocate_slots("plain", 1)
    with pytest.raises(sc.FailedPrecondition, match="--shared_pools"):
        attached.AttachedSession(server.target, "plain", slots, library=lib)
    # The failed attach left nothing attached.
    c.release_slots("plain", slots)
    c.drop_model("plain", force=True)
    c.close()
