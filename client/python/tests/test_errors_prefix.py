"""Status-code mapping and the client-side prefix hash chain."""
import grpc
import pytest

import statecache as sc
from statecache.errors import error_from_code


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
    with pytest.raises(ValueError, match="tokens: 4294967296"):
        sc.prefix_keys([1 << 32])
    with pytest.raises(ValueError, match="tokens: empty"):
        sc.prefix_hash([])
