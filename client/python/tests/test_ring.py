"""The consistent-hash ring: shared vectors with C++, balance, stability."""
import collections

import pytest

import statecache as sc

from conftest import RING_VECTORS
from statecache.ring import HashRing, fnv1a64, hash64, key_bytes

N_KEYS = 20000


def read_vectors():
    rows = []
    with open(RING_VECTORS, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                rows.append(line.split("\t"))
    return rows


def test_hashes_match_shared_vectors():
    rows = read_vectors()
    fnv = [r for r in rows if r[0] == "fnv1a64"]
    hashes = [r for r in rows if r[0] == "hash64"]
    assert len(fnv) == 3 and len(hashes) >= 9
    for _, key, want in fnv:
        assert fnv1a64(key.encode()) == int(want, 16), key
    for _, key, want in hashes:
        assert hash64(key.encode()) == int(want, 16), key


def test_published_fnv_values():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_routes_match_shared_vectors():
    rings, routes = {}, 0
    for row in read_vectors():
        if row[0] == "ring":
            rings[row[1]] = HashRing(row[3].split(","), int(row[2]))
        elif row[0] == "route":
            assert rings[row[1]].route(row[2]) == row[3], (row[1], row[2])
            routes += 1
    assert len(rings) == 3 and routes >= 300


def endpoints(n):
    return [f"statecached-{i}:50051" for i in range(n)]


def test_spreads_keys_evenly():
    ring = HashRing(endpoints(8))
    counts = collections.Counter(ring.route(f"conv-{i}") for i in range(N_KEYS))
    assert len(counts) == 8
    for c in counts.values():
        assert 0.8 * N_KEYS / 8 < c < 1.2 * N_KEYS / 8, counts


def test_removing_an_endpoint_moves_only_its_keys():
    ring = HashRing(endpoints(8))
    removed = "statecached-3:50051"
    smaller = ring.without_endpoint(removed)
    moved = 0
    for i in range(N_KEYS):
        before, after = ring.route(f"conv-{i}"), smaller.route(f"conv-{i}")
        if before == removed:
            assert after != removed
            moved += 1
        else:
            assert before == after
    assert 0.8 * N_KEYS / 8 < moved < 1.2 * N_KEYS / 8


def test_adding_an_endpoint_moves_about_one_nth():
    ring = HashRing(endpoints(8))
    added = "statecached-8:50051"
    bigger = ring.with_endpoint(added)
    moved = [i for i in range(N_KEYS) if ring.route(f"conv-{i}") != bigger.route(f"conv-{i}")]
    assert all(bigger.route(f"conv-{i}") == added for i in moved)
    assert 0.7 * N_KEYS / 9 < len(moved) < 1.3 * N_KEYS / 9


def test_endpoint_order_does_not_matter():
    a, b = HashRing(endpoints(5)), HashRing(list(reversed(endpoints(5))))
    assert all(a.route(f"k{i}") == b.route(f"k{i}") for i in range(2000))


def test_key_types():
    ring = HashRing(endpoints(4))
    assert ring.route(42) == ring.route("42") == ring.route(b"42")
    assert key_bytes("对话") == "对话".encode("utf-8")
    with pytest.raises(TypeError):
        ring.route(1.5)
    with pytest.raises(TypeError):
        ring.route(True)


@pytest.mark.parametrize("eps, vnodes, match", [
    ([], 256, "endpoints: empty"),
    (["a:1", ""], 256, "invalid endpoint"),
    (["a:1", "b:1", "a:1"], 256, "duplicated"),
    (["a:1"], 0, "virtual_nodes"),
    (["a:1"], 65537, "virtual_nodes"),
])
def test_rejects_bad_input(eps, vnodes, match):
    with pytest.raises(sc.InvalidArgument, match=match):
        HashRing(eps, vnodes)


def test_without_endpoint_errors():
    ring = HashRing(["a:1"])
    with pytest.raises(sc.InvalidArgument, match="not in the ring"):
        ring.without_endpoint("b:1")
    with pytest.raises(sc.InvalidArgument, match="empty"):
        ring.without_endpoint("a:1")
    with pytest.raises(sc.InvalidArgument, match="duplicated"):
        ring.with_endpoint("a:1")


def test_sharded_from_dns_localhost():
    import statecache as sc
    cluster = sc.ShardedClient.from_dns("localhost", 50099)
    assert cluster.endpoints  # 127.0.0.1:50099 and/or [::1]:50099
    for e in cluster.endpoints:
        assert e in ("127.0.0.1:50099", "[::1]:50099")
    assert cluster.endpoint_for("conv-1") in cluster.endpoints
    cluster.close()


def test_sharded_from_dns_unresolvable_is_unavailable_naming_host():
    with pytest.raises(sc.Unavailable, match="'no-such-host.invalid' does not resolve") as e:
        sc.ShardedClient.from_dns("no-such-host.invalid", 50051)
    assert e.value.method == "from_dns"
