"""Status-code mapping and the client-side prefix hash chain."""
import os
import time

import grpc
import numpy as np
import pytest

import statecache as sc
from statecache import prefix
from statecache.errors import ALL_ERRORS, error_from_code
from statecache.ring import fnv1a64


@pytest.mark.parametrize("code, cls", [
    (3, sc.InvalidArgument), (5, sc.NotFound), (6, sc.AlreadyExists),
    (8, sc.ResourceExhausted), (9, sc.FailedPrecondition), (14, sc.Unavailable),
    (grpc.StatusCode.NOT_FOUND, sc.NotFound), (grpc.StatusCode.UNIMPLEMENTED, sc.Unimplemented),
])
def test_error_from_code(code, cls):
    e = error_from_code(code, "slots[0]: unknown handle", "Update")
    assert type(e) is cls
    assert isinstance(e, sc.StateCacheError)
    assert e.message == "slots[0]: unknown handle" and e.method == "Update"
    assert str(e) == f"Update: {cls.code.name}: slots[0]: unknown handle"


def test_unknown_code():
    e = error_from_code(99, "x")
    assert type(e) is sc.StateCacheError and e.code == grpc.StatusCode.UNKNOWN
    assert "(code 99)" in str(e)


def test_prefix_chain():
    keys = sc.prefix_keys([1, 2, 3])
    assert [k.num_tokens for k in keys] == [1, 2, 3]
    assert sc.prefix_hash([1, 2, 3]) == keys[-1]
    assert sc.prefix_keys([1, 2]) == keys[:2]  # a chain: prefixes share keys
    assert len({k.hash for k in keys}) == 3
    assert sc.prefix_hash([-1]).hash != sc.prefix_hash([1]).hash
    with pytest.raises(sc.InvalidArgument, match="tokens: 4294967296 is not an int32"):
        sc.prefix_keys([1 << 32])
    with pytest.raises(sc.InvalidArgument, match="tokens: empty"):
        sc.prefix_hash([])
    with pytest.raises(sc.InvalidArgument, match="tokens: 'a' is not an integer"):
        sc.prefix_keys([1, "a"])


# Vectors of server/pool/prefix_key_test.cc (the server's ChainHashStep /
# KeyOfTokens), so the client chain is the server's bit for bit.
def test_prefix_chain_matches_server_vectors():
    assert sc.prefix_hash([1]).hash == 0xB46D04D1C6DAA804
    assert sc.prefix_hash([1, 2, 3]) == sc.PrefixKey(0xACCF2087CDF1EF5D, 3)
    assert sc.prefix_hashes(np.array([1, 2, 3], np.int32))[-1] == 0xACCF2087CDF1EF5D


def test_native_and_python_chains_agree():
    rng = np.random.default_rng(7)
    tokens = rng.integers(-(1 << 31), 1 << 31, 5000, dtype=np.int64)
    native = sc.prefix_hashes(tokens)
    out = np.empty(tokens.size, np.uint64)
    prefix._chain_python(0, tokens.astype(np.int32), out)
    np.testing.assert_array_equal(native, out)
    # every=, start= and the input kinds give the same chain
    keys = sc.prefix_keys(tokens.tolist())
    assert keys[-1] == sc.PrefixKey(int(native[-1]), 5000)
    assert sc.prefix_keys(tokens, every=16) == keys[15::16]
    assert sc.prefix_keys(tokens[100:], start=keys[99]) == keys[100:]
    assert sc.prefix_keys(tokens.astype(np.uint16)) == sc.prefix_keys(
        tokens.astype(np.uint16).tolist())
    with pytest.raises(sc.InvalidArgument, match="every"):
        sc.prefix_keys([1], every=0)


def test_native_chain_is_loaded_where_required():
    # The Bazel test builds the C chain and sets STATECACHE_REQUIRE_NATIVE_PREFIX.
    if os.environ.get("STATECACHE_REQUIRE_NATIVE_PREFIX") == "1":
        assert prefix.NATIVE, os.environ.get("STATECACHE_PREFIX_LIB")
        tokens = np.arange(1 << 17, dtype=np.int32)
        t = time.perf_counter()
        sc.prefix_hashes(tokens)
        assert time.perf_counter() - t < 0.1  # pure Python takes ~0.5 s


def test_block_keys_from_engine_hashes():
    keys = sc.block_keys([5, (1 << 64) + 7, b"\x01\x02", "abc"], 16)
    assert keys[0] == sc.PrefixKey(5, 16) and keys[1] == sc.PrefixKey(7, 32)
    assert keys[2] == sc.PrefixKey(fnv1a64(b"\x01\x02"), 48)
    assert keys[3] == sc.PrefixKey(fnv1a64(b"abc"), 64)
    with pytest.raises(sc.InvalidArgument, match=r"block_hashes\[0\]"):
        sc.block_keys([1.5], 16)
    with pytest.raises(sc.InvalidArgument, match="block_size"):
        sc.block_keys([1], 0)


def test_every_error_class_is_exported():
    for cls in ALL_ERRORS:
        assert getattr(sc, cls.__name__) is cls and cls.__name__ in sc.__all__
    assert sc.Unauthenticated.code == grpc.StatusCode.UNAUTHENTICATED
    assert sc.PermissionDenied.code == grpc.StatusCode.PERMISSION_DENIED
