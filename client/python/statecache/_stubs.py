"""Lazy access to the generated gRPC stubs (statecache.v1.statecache_pb2 and
_pb2_grpc), with a clear error when they were not generated."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def _load():
    try:
        from statecache.v1 import statecache_pb2, statecache_pb2_grpc
    except ImportError as e:
        raise ImportError(
            "statecache: gRPC stubs not generated; run `python -m statecache._gen` "
            "(in a source checkout) or install the package with pip") from e
    return statecache_pb2, statecache_pb2_grpc


def pb2():
    return _load()[0]


def pb2_grpc():
    return _load()[1]
