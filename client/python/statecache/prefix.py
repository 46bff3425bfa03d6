"""Prefix-cache keys: the hash chain of proto PrefixKey, computed client-side.

    h_0 = 0
    h_i = FNV-1a-64(le64(h_{i-1}) || le32(token_i))

The key of the first n tokens is (h_n, n). Workers may send token ids (the
server hashes them) or these keys (LookupPrefix with many candidates sends 12
bytes per candidate instead of the whole token list per call).

    keys = prefix_keys([151644, 872, 198])   # 3 keys, one per prefix length
"""
from __future__ import annotations

import struct
from typing import Iterable, List

from statecache.ring import FNV_OFFSET_BASIS, FNV_PRIME, _MASK
from statecache.types import PrefixKey


def _step(h: int, token: int) -> int:
    if not -(1 << 31) <= token < (1 << 31):
        raise ValueError(f"tokens: {token} is not an int32 token id")
    x = FNV_OFFSET_BASIS
    for b in struct.pack("<Qi", h, token):
        x = ((x ^ b) * FNV_PRIME) & _MASK
    return x


def prefix_keys(tokens: Iterable[int]) -> List[PrefixKey]:
    """Keys of every prefix: element i is the key of tokens[:i+1]."""
    h = 0
    keys = []
    for n, t in enumerate(tokens, start=1):
        h = _step(h, int(t))
        keys.append(PrefixKey(h, n))
    return keys


def prefix_hash(tokens: Iterable[int]) -> PrefixKey:
    """Key of the whole token sequence (ValueError when empty)."""
    keys = prefix_keys(tokens)
    if not keys:
        raise ValueError("tokens: empty")
    return keys[-1]
