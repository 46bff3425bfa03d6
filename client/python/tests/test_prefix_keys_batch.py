"""Issue 31 from Python against a real statecached: SHA-256 and engine keys,
lookup_prefix(peek=True), release_lease, and the batch calls with per-item
errors (sync and asyncio clients)."""
import asyncio
import hashlib
import struct

import numpy as np
import pytest

import statecache as sc
import statecache.aio as sca

GEOM = sc.Geometry("gdn", layers=2, h_qk=1, h_v=2, d_k=32, d_v=32)
M = "keys31"


@pytest.fixture(scope="module")
def model(client):
    info = client.register_model(M, GEOM, "fp32", slots=6, checkpoints=6)
    yield info
    client.drop_model(M, force=True)


@pytest.fixture()
def slots(client, model):
    s = client.allocate_slots(M, 3)
    rng = np.random.default_rng(31)
    states = rng.uniform(-0.5, 0.5, (3, GEOM.layers, GEOM.h_v, 32, 32)).astype(np.float32)
    client.prefill_states(M, s, states)
    yield s
    client.release_slots(M, s)


def packed(client, slot):
    return client.export_state(M, slot).packed


def test_sha256_keys_match_the_definition():
    d = bytes(32)
    want = []
    for t in [1, 2, 3]:
        d = hashlib.sha256(d + struct.pack("<i", t)).digest()
        want.append(d)
    keys = sc.sha256_prefix_keys([1, 2, 3])
    assert [k.digest for k in keys] == want
    assert [k.num_tokens for k in keys] == [1, 2, 3]
    assert {k.kind for k in keys} == {sc.KEY_SHA256} and {k.hash for k in keys} == {0}
    # Same value as the server's pinned C++ test (prefix_key_test.cc).
    assert keys[-1].digest.hex() == \
        "f2032b5b5b68166de50faefebf08f31965507f5555eb836098863a12700dade7"
    assert sc.sha256_prefix_keys([1, 2, 3, 4], every=2) == [keys[1],
                                                            sc.sha256_prefix_hash([1, 2, 3, 4])]
    assert sc.sha256_prefix_keys([3], start=keys[1]) == [keys[2]]
    # FNV keys keep their old value and gain the default kind.
    assert sc.prefix_hash([1, 2, 3]) == sc.PrefixKey(0xACCF2087CDF1EF5D, 3, sc.KEY_FNV64, b"")
    with pytest.raises(sc.InvalidArgument, match=r"block_hashes\[1\]: 65 bytes"):
        sc.engine_keys([b"a", b"x" * 65], 16)


def test_sha256_and_engine_keys_round_trip(client, slots):
    snap = client.snapshot(M, slots[0], tokens=[5, 6, 7], key_kind=sc.KEY_SHA256)
    assert snap.key == sc.sha256_prefix_hash([5, 6, 7])
    hit = client.lookup_prefix(M, tokens=[5, 6, 7, 8], key_kind=sc.KEY_SHA256)
    assert hit.hit and hit.key == snap.key and hit.lease_id != 0
    assert not client.lookup_prefix(M, tokens=[5, 6, 7, 8]).hit  # FNV chain: another key
    r = client.restore(M, slots[1], hit.key, hit.lease_id)
    assert r.num_tokens == 3
    assert packed(client, slots[1]) == packed(client, slots[0])

    [block] = sc.engine_keys([b"\x00engine-block\xff"], 16)
    client.snapshot(M, slots[2], key=block, aux=[b"a", b"b"])
    by_keys = client.lookup_prefix(M, keys=[block])
    assert by_keys.hit and by_keys.key == block
    r = client.restore(M, slots[0], block, by_keys.lease_id)
    assert r.aux == [b"a", b"b"] and r.num_tokens == 16
    assert packed(client, slots[0]) == packed(client, slots[2])


def test_bad_keys_are_invalid_argument_naming_the_field(client, slots):
    with pytest.raises(sc.InvalidArgument, match=r": key\.digest: 3 bytes, PREFIX_KEY_KIND_SHA256"):
        client.snapshot(M, slots[0], key=sc.PrefixKey(0, 2, sc.KEY_SHA256, b"abc"))
    with pytest.raises(sc.InvalidArgument, match=r": key_kind: PREFIX_KEY_KIND_ENGINE"):
        client.snapshot(M, slots[0], tokens=[1], key_kind=sc.KEY_ENGINE)
    with pytest.raises(sc.InvalidArgument, match=r"key_kind: 7 is not KEY_FNV64"):
        client.lookup_prefix(M, tokens=[1], key_kind=7)
    with pytest.raises(sc.InvalidArgument, match=r": keys\.keys\[0\]\.digest: must be empty"):
        client.lookup_prefix(M, keys=[sc.PrefixKey(1, 1, sc.KEY_FNV64, b"x")])
    with pytest.raises(sc.InvalidArgument, match=r"lease_id: 0 is below 1"):
        client.release_lease(M, 0)


def test_peek_and_release_lease_keep_the_gauges(client, slots):
    client.snapshot(M, slots[0], tokens=[40, 41])
    before = client.get_stats(M).model(M).stats
    peek = client.lookup_prefix(M, tokens=[40, 41, 42], peek=True)
    assert peek.hit and peek.key == sc.prefix_hash([40, 41]) and peek.lease_id == 0
    after = client.get_stats(M).model(M).stats
    assert after.leases_active == before.leases_active
    assert (after.lookups_hit, after.lookups_miss) == (before.lookups_hit, before.lookups_miss)
    lease = client.lookup_prefix(M, tokens=[40, 41])
    assert client.get_stats(M).model(M).stats.leases_active == before.leases_active + 1
    client.release_lease(M, lease.lease_id)
    released = client.get_stats(M).model(M).stats
    assert released.leases_active == before.leases_active
    assert released.leases_expired == before.leases_expired
    with pytest.raises(sc.NotFound, match=r": lease_id: unknown or expired lease"):
        client.release_lease(M, lease.lease_id)


def test_batches_answer_per_item(client, slots):
    snaps = client.batch_snapshot(M, [
        sc.SnapshotItem(slots[0], tokens=[70, 71]),
        sc.SnapshotItem(slots[1], tokens=[72], aux=[b"one layer only"]),
        sc.SnapshotItem(slots[1], tokens=[73, 74], key_kind=sc.KEY_SHA256),
    ])
    assert isinstance(snaps[0], sc.SnapshotResult) and snaps[0].key == sc.prefix_hash([70, 71])
    assert isinstance(snaps[1], sc.InvalidArgument)
    assert snaps[1].message.startswith("items[1].aux: 1 entries")
    assert snaps[2].key == sc.sha256_prefix_hash([73, 74])

    looks = client.batch_lookup_prefix(M, [
        sc.LookupItem(tokens=[70, 71, 99]),
        sc.LookupItem(tokens=[73, 74], key_kind=sc.KEY_SHA256, peek=True),
        sc.LookupItem(keys=[sc.PrefixKey(0, 2, sc.KEY_ENGINE, b"")]),
    ])
    assert looks[0].hit and looks[0].lease_id != 0
    assert looks[1].hit and looks[1].lease_id == 0
    assert isinstance(looks[2], sc.InvalidArgument)
    assert looks[2].message.startswith("items[2].keys.keys[0].digest: 0 bytes")

    restores = client.batch_restore(M, [
        sc.RestoreItem(slots[2], looks[0].key, looks[0].lease_id),
        sc.RestoreItem(slots[2], sc.prefix_hash([1234])),
    ])
    assert restores[0].num_tokens == 2
    assert isinstance(restores[1], sc.NotFound)
    assert restores[1].message.startswith("items[1].key: no checkpoint for prefix")
    assert packed(client, slots[2]) == packed(client, slots[0])
    with pytest.raises(sc.InvalidArgument, match=r"INVALID_ARGUMENT: items: empty batch$"):
        client.batch_restore(M, [])
    with pytest.raises(sc.InvalidArgument, match=r"items\[0\]: .* is not a RestoreItem"):
        client.batch_restore(M, [sc.LookupItem(tokens=[1])])
    with pytest.raises(sc.NotFound):
        client.batch_lookup_prefix("no-such-model", [sc.LookupItem(tokens=[1])])


def test_aio_has_the_new_calls(server, client, slots):
    async def main():
        async with sca.Client(server.target, timeout=30) as c:
            await c.wait_ready(10)
            key = (await c.snapshot(M, slots[0], tokens=[80], key_kind=sc.KEY_SHA256)).key
            peek = await c.lookup_prefix(M, keys=[key], peek=True)
            assert peek.hit and peek.lease_id == 0
            [hit] = await c.batch_lookup_prefix(M, [sc.LookupItem(keys=[key])])
            await c.release_lease(M, hit.lease_id)
            [snap] = await c.batch_snapshot(M, [sc.SnapshotItem(slots[1], key=key)])
            assert snap.key == key
            [res] = await c.batch_restore(M, [sc.RestoreItem(slots[2], key)])
            assert res.num_tokens == 1
            with pytest.raises(sc.NotFound):
                await c.release_lease(M, hit.lease_id)

    asyncio.run(main())
