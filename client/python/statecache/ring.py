"""Consistent-hash ring: routes a conversation id to one statecached endpoint.

The same algorithm (and the same test vectors, client/routing/testdata/
ring_vectors.tsv) as the C++ ring in client/routing/hash_ring.h, so a Python
worker and a C++ worker route a conversation to the same server:

  hash64(b)   = fmix64(FNV-1a-64(b)), FNV-1a with offset basis (the seed)
                0xcbf29ce484222325 and prime 0x100000001b3 over the bytes b;
                fmix64 is MurmurHash3's 64-bit finalizer (for avalanche).
  ring points = hash64(utf8(endpoint) + b"#" + decimal(i)) for every endpoint
                and i in [0, virtual_nodes), sorted by (point, endpoint).
  route(key)  = the endpoint of the first point >= hash64(key), wrapping to
                the first point.

Adding or removing one of N endpoints moves only the keys of that endpoint
(about 1/N of them); every other key keeps its server, so a conversation's
checkpoints stay where they were.

    ring = HashRing(["10.0.0.1:50051", "10.0.0.2:50051"])
    ring.route("conversation-42")  # -> "10.0.0.2:50051"
"""

from __future__ import annotations

import bisect
from typing import Iterable, List, Sequence, Tuple, Union

from statecache.errors import InvalidArgument

FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
DEFAULT_VIRTUAL_NODES = 256
MAX_VIRTUAL_NODES = 65536
_MASK = 0xFFFFFFFFFFFFFFFF

Key = Union[str, bytes, int]


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 of `data` (offset basis 0xcbf29ce484222325)."""
    h = FNV_OFFSET_BASIS
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & _MASK
    return h


def fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finalizer."""
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _MASK
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _MASK
    k ^= k >> 33
    return k


def key_bytes(key: Key) -> bytes:
    """The bytes a key is hashed as: UTF-8 for str, as is for bytes, decimal
    ASCII for int (so 42 and "42" route alike)."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key).encode("ascii")
    raise TypeError(f"routing key must be str, bytes or int, got {type(key).__name__}")


def hash64(data: bytes) -> int:
    """The ring hash: fmix64(fnv1a64(data))."""
    return fmix64(fnv1a64(data))


class HashRing:
    """An immutable consistent-hash ring over endpoint names.

    Raises InvalidArgument (a ValueError) for an empty or duplicated endpoint list, an empty
    endpoint name, or virtual_nodes outside [1, 65536]. Thread-safe (immutable).
    """

    def __init__(self, endpoints: Iterable[str], virtual_nodes: int = DEFAULT_VIRTUAL_NODES):
        eps = list(endpoints)
        if not eps:
            raise InvalidArgument("endpoints: empty")
        if len(set(eps)) != len(eps):
            raise InvalidArgument("endpoints: duplicated endpoint")
        for e in eps:
            if not isinstance(e, str) or not e:
                raise InvalidArgument(f"endpoints: invalid endpoint {e!r}")
        if not isinstance(virtual_nodes, int) or not 1 <= virtual_nodes <= MAX_VIRTUAL_NODES:
            raise InvalidArgument(f"virtual_nodes: {virtual_nodes!r} not in [1, {MAX_VIRTUAL_NODES}]")
        self._endpoints: Tuple[str, ...] = tuple(eps)
        self._virtual_nodes = virtual_nodes
        points: List[Tuple[int, str]] = []
        for e in eps:
            prefix = e.encode("utf-8") + b"#"
            for i in range(virtual_nodes):
                points.append((hash64(prefix + str(i).encode("ascii")), e))
        points.sort()
        self._hashes = [p[0] for p in points]
        self._owners = [p[1] for p in points]

    @property
    def endpoints(self) -> Tuple[str, ...]:
        return self._endpoints

    @property
    def virtual_nodes(self) -> int:
        return self._virtual_nodes

    def route(self, key: Key) -> str:
        """The endpoint that owns `key`."""
        h = hash64(key_bytes(key))
        i = bisect.bisect_left(self._hashes, h)
        if i == len(self._hashes):
            i = 0
        return self._owners[i]

    def with_endpoint(self, endpoint: str) -> "HashRing":
        """A new ring with `endpoint` added."""
        return HashRing(self._endpoints + (endpoint,), self._virtual_nodes)

    def without_endpoint(self, endpoint: str) -> "HashRing":
        """A new ring with `endpoint` removed (InvalidArgument if absent or last)."""
        if endpoint not in self._endpoints:
            raise InvalidArgument(f"endpoints: {endpoint!r} not in the ring")
        return HashRing([e for e in self._endpoints if e != endpoint], self._virtual_nodes)

    def __repr__(self) -> str:
        return f"HashRing({list(self._endpoints)!r}, virtual_nodes={self._virtual_nodes})"


def ring_points(endpoints: Sequence[str], virtual_nodes: int) -> List[Tuple[int, str]]:
    """The sorted (point, endpoint) list (for tests and debugging)."""
    r = HashRing(endpoints, virtual_nodes)
    return list(zip(r._hashes, r._owners))
