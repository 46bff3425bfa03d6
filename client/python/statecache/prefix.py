"""Prefix-cache keys: the hash chain of proto PrefixKey, computed client-side.

    h_0 = 0
    h_i = FNV-1a-64(le64(h_{i-1}) || le32(token_i))

The key of the first n tokens is (h_n, n), exactly as the server computes it
for `tokens=` requests (server/pool/prefix_key.h; shared test vectors).
Workers may send token ids (the server hashes them) or keys (LookupPrefix
with many candidates sends 12 bytes per candidate instead of the tokens).

    keys = prefix_keys([151644, 872, 198])          # 3 keys, one per prefix length
    keys = prefix_keys(prompt_ids, every=16)        # keys at 16, 32, ... tokens
    h = prefix_hashes(np.asarray(ids, np.int32))    # uint64 [n], no objects
    keys = block_keys(engine_block_hashes, 16)      # an engine's own block hashes

Stronger keys (issue 31; FNV-1a stays the default for this release):

    d_0 = 32 zero bytes
    d_i = SHA-256(d_{i-1} || le32(token_i))          # kind KEY_SHA256, digest d_n

    keys = sha256_prefix_keys(prompt_ids, every=16)  # or tokens=..., key_kind=KEY_SHA256
    keys = engine_keys(vllm_block_hashes, 16)        # kind KEY_ENGINE, opaque bytes

The server salts every key with the caller's tenant before storing it, so
keys stay the same for every tenant on the client side.

The chain is computed by a small C library (statecache/_prefixhash.c, built
with the package; about 1 ms for 128k tokens) and by equivalent pure Python
where it is absent (`NATIVE` says which; about 0.5 s for 128k tokens).
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import itertools
import os
import struct
from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np

from statecache.errors import InvalidArgument
from statecache.ring import FNV_OFFSET_BASIS, FNV_PRIME, _MASK, fnv1a64
from statecache.types import KEY_ENGINE, KEY_FNV64, KEY_SHA256, PrefixKey


def _load_native() -> Optional[ctypes.CDLL]:
    """The C chain: $STATECACHE_PREFIX_LIB, else the extension built next to
    this file by setup.py. None when neither loads."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.environ.get("STATECACHE_PREFIX_LIB")] + sorted(
        glob.glob(os.path.join(here, "_prefixhash*.so")))
    for p in paths:
        if not p:
            continue
        try:
            lib = ctypes.CDLL(p)
        except OSError:
            continue
        fn = lib.statecache_prefix_chain
        fn.restype = None
        fn.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return lib
    return None


_LIB = _load_native()
NATIVE: bool = _LIB is not None
"""True when the C chain is loaded (else pure Python, same results)."""

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def _tokens_array(tokens: Any) -> np.ndarray:
    """tokens as contiguous int32 (InvalidArgument naming the first token that
    is not an int32 token id)."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32:
        return np.ascontiguousarray(tokens.ravel())
    if is_torch_tensor(tokens):
        tokens = tokens.detach().cpu().numpy()
    try:
        a = np.asarray(tokens if isinstance(tokens, (np.ndarray, Sequence)) else list(tokens))
    except (TypeError, ValueError, OverflowError):
        a = np.asarray(list(tokens), dtype=object)
    if a.dtype.kind not in "iuO" and not isinstance(tokens, np.ndarray):
        a = np.asarray(list(tokens), dtype=object)  # e.g. [1, "a"] became strings
    if a.size == 0:
        return np.zeros(0, np.int32)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        for t in np.ravel(a).tolist() if a.ndim else [a.item()]:
            if isinstance(t, bool) or not isinstance(t, int):
                raise InvalidArgument(f"tokens: {t!r} is not an integer token id")
            if not _INT32_MIN <= t <= _INT32_MAX:
                raise InvalidArgument(f"tokens: {t} is not an int32 token id")
        if a.ndim != 1:
            raise InvalidArgument(f"tokens: shape {a.shape} is not 1-D")
    elif (a.dtype.kind == "u" and a.dtype.itemsize >= 4) or a.dtype.itemsize > 4:
        out = (a < _INT32_MIN) | (a > _INT32_MAX)
        if out.any():
            raise InvalidArgument(f"tokens: {a[np.argmax(out)]} is not an int32 token id")
    return np.ascontiguousarray(a, dtype=np.int32)


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _chain_python(h: int, tokens: np.ndarray, out: np.ndarray) -> None:
    p, m, basis = FNV_PRIME, _MASK, FNV_OFFSET_BASIS
    for i, t in enumerate(tokens.view(np.uint32).tolist()):
        x = basis
        for _ in range(8):
            x = ((x ^ (h & 0xFF)) * p) & m
            h >>= 8
        for _ in range(4):
            x = ((x ^ (t & 0xFF)) * p) & m
            t >>= 8
        h = x
        out[i] = h


def prefix_hashes(tokens: Any, start: Optional[PrefixKey] = None) -> np.ndarray:
    """uint64 [n]: element i is h of tokens[:i+1] (the hash of key i+1), or of
    start's prefix followed by tokens[:i+1] when `start` is given (extends a
    known key without its tokens). tokens: ints, a numpy integer array or a
    torch tensor; InvalidArgument for a value outside int32."""
    a = _tokens_array(tokens)
    h0 = 0 if start is None else int(start.hash) & _MASK
    out = np.empty(a.size, np.uint64)
    if a.size:
        if _LIB is not None:
            _LIB.statecache_prefix_chain(h0, a.ctypes.data, a.size, out.ctypes.data)
        else:
            _chain_python(h0, a, out)
    return out


def prefix_keys(tokens: Any, *, every: int = 1,
                start: Optional[PrefixKey] = None) -> List[PrefixKey]:
    """Keys of the prefixes of every `every` tokens: with every=1 element i
    is the key of tokens[:i+1]; with every=16 the keys of 16, 32, ... tokens
    (what a block-granular engine looks up). `start`: continue the chain of
    that key (num_tokens count from it)."""
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise InvalidArgument(f"every: {every!r} is not a positive integer")
    h = prefix_hashes(tokens, start)
    base = 0 if start is None else int(start.num_tokens)
    idx = np.arange(every - 1, h.size, every)
    return list(map(PrefixKey._make, zip(h[idx].tolist(), (idx + (1 + base)).tolist(),
                                         itertools.repeat(KEY_FNV64), itertools.repeat(b""))))


def prefix_hash(tokens: Any) -> PrefixKey:
    """Key of the whole token sequence (InvalidArgument when empty)."""
    h = prefix_hashes(tokens)
    if not h.size:
        raise InvalidArgument("tokens: empty")
    return PrefixKey(int(h[-1]), int(h.size))


def block_keys(block_hashes: Iterable[Union[int, bytes, str]],
               block_size: int) -> List[PrefixKey]:
    """Keys from an engine's own block hashes (vLLM / SGLang prefix caching):
    element i is PrefixKey(hash_i, (i+1) * block_size). Integer hashes are
    taken mod 2^64; bytes / str (e.g. sha256 digests) are hashed with
    FNV-1a-64. Such keys name checkpoints only for calls that pass keys
    (snapshot(key=), lookup_prefix(keys=)): the server's own `tokens=` keys
    are the chain above. The engine's hash must cover the whole prefix (as
    chained block hashes do), not only the block. engine_keys keeps the
    engine's bytes whole (KEY_ENGINE) instead of folding them into 64 bits."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or block_size < 1:
        raise InvalidArgument(f"block_size: {block_size!r} is not a positive integer")
    out = []
    for i, b in enumerate(block_hashes):
        if isinstance(b, (bytes, bytearray, memoryview)):
            h = fnv1a64(bytes(b))
        elif isinstance(b, str):
            h = fnv1a64(b.encode())
        elif isinstance(b, (int, np.integer)) and not isinstance(b, bool):
            h = int(b) & _MASK
        else:
            raise InvalidArgument(f"block_hashes[{i}]: {b!r} is not an int, bytes or str")
        out.append(PrefixKey(h, (i + 1) * int(block_size)))
    return out


def sha256_prefix_keys(tokens: Any, *, every: int = 1,
                       start: Optional[PrefixKey] = None) -> List[PrefixKey]:
    """KEY_SHA256 keys of the prefixes of every `every` tokens (as
    prefix_keys): d_i = SHA-256(d_{i-1} || le32(token_i)), d_0 = 32 zero
    bytes, or start.digest to continue a known SHA-256 key."""
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise InvalidArgument(f"every: {every!r} is not a positive integer")
    if start is not None and (start.kind != KEY_SHA256 or len(start.digest) != 32):
        raise InvalidArgument("start: not a KEY_SHA256 key with a 32-byte digest")
    a = _tokens_array(tokens)
    d = bytes(32) if start is None else bytes(start.digest)
    base = 0 if start is None else int(start.num_tokens)
    sha, pack = hashlib.sha256, struct.Struct("<i").pack
    out = []
    for i, t in enumerate(a.tolist()):
        d = sha(d + pack(t)).digest()
        if (i + 1) % every == 0:
            out.append(PrefixKey(0, base + i + 1, KEY_SHA256, d))
    return out


def sha256_prefix_hash(tokens: Any) -> PrefixKey:
    """KEY_SHA256 key of the whole token sequence (InvalidArgument when empty)."""
    keys = sha256_prefix_keys(tokens)
    if not keys:
        raise InvalidArgument("tokens: empty")
    return keys[-1]


def engine_keys(block_hashes: Iterable[Union[bytes, str]], block_size: int) -> List[PrefixKey]:
    """KEY_ENGINE keys from an engine's own chained block hashes, kept as
    opaque bytes (1..64 bytes each; str is UTF-8 encoded): element i is the
    key of (i+1) * block_size tokens. Unlike block_keys nothing is folded into
    64 bits, so two engine hashes never collide unless the engine's do."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or block_size < 1:
        raise InvalidArgument(f"block_size: {block_size!r} is not a positive integer")
    out = []
    for i, b in enumerate(block_hashes):
        if isinstance(b, str):
            b = b.encode()
        if not isinstance(b, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"block_hashes[{i}]: {b!r} is not bytes or str")
        b = bytes(b)
        if not 1 <= len(b) <= 64:
            raise InvalidArgument(f"block_hashes[{i}]: {len(b)} bytes, need 1..64")
        out.append(PrefixKey(0, (i + 1) * int(block_size), KEY_ENGINE, b))
    return out
