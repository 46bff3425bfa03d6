"""Plain dataclasses for the statecache.v1 messages the client returns.

Field names equal the proto's (proto/statecache/v1/statecache.proto documents
each), so `ModelStats.slots_allocated` is `ModelStats.slots_allocated` there.
Handles and keys are frozen (hashable) so they can key dicts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from statecache.errors import InvalidArgument

_ARCHES = {"gdn": 1, "kda": 2}
_ARCH_NAMES = {v: k for k, v in _ARCHES.items()}


@dataclass(frozen=True)
class Geometry:
    """arch "gdn" or "kda"; layers; h_qk; h_v; d_k; d_v; scale (0 = 1/sqrt(d_k))."""
    arch: str
    layers: int
    h_qk: int
    h_v: int
    d_k: int = 128
    d_v: int = 128
    scale: float = 0.0

    def to_pb(self, pb: Any) -> Any:
        arch = _ARCHES.get(self.arch.lower() if isinstance(self.arch, str) else self.arch)
        if arch is None:
            raise InvalidArgument(f"geometry.arch: {self.arch!r} is not 'gdn' or 'kda'")
        for name in ("layers", "h_qk", "h_v", "d_k", "d_v"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise InvalidArgument(f"geometry.{name}: {x!r} is not an integer")
        return pb.Geometry(arch=arch, layers=self.layers, h_qk=self.h_qk, h_v=self.h_v,
                           d_k=self.d_k, d_v=self.d_v, scale=self.scale)

    @classmethod
    def from_pb(cls, m: Any) -> "Geometry":
        return cls(_ARCH_NAMES.get(m.arch, f"arch{m.arch}"), m.layers, m.h_qk, m.h_v, m.d_k,
                   m.d_v, m.scale)

    @property
    def states_per_slot(self) -> int:
        return self.layers * self.h_v


@dataclass
class LayoutMaps:
    """Calibrated maps (flattened, see proto LayoutMaps); empty = identity."""
    key_perm: Sequence[int] = ()
    value_order: Sequence[int] = ()
    value_scale: Sequence[float] = ()

    def to_pb(self, pb: Any) -> Any:
        return pb.LayoutMaps(key_perm=np.asarray(self.key_perm, np.int32).ravel().tolist(),
                             value_order=np.asarray(self.value_order, np.int32).ravel().tolist(),
                             value_scale=np.asarray(self.value_scale,
                                                    np.float32).ravel().tolist())


@dataclass(frozen=True)
class SlotHandle:
    """Opaque slot name (random id + generation)."""
    id: int
    generation: int

    def to_pb(self, pb: Any) -> Any:
        return pb.SlotHandle(id=self.id, generation=self.generation)

    @classmethod
    def from_pb(cls, m: Any) -> "SlotHandle":
        return cls(m.id, m.generation)


# PrefixKey.kind (proto enum PrefixKeyKind). FNV64 stays the default for
# this release; SHA256 chains (sha256_prefix_keys) and ENGINE block hashes
# (engine_keys) are accepted next to it, and a checkpoint is found only
# under the kind it was stored with.
KEY_FNV64 = 0
KEY_SHA256 = 1
KEY_ENGINE = 2


class PrefixKey(NamedTuple):
    """Key of a prefix-cache checkpoint: chained hash h_n (FNV64), or a
    digest (SHA256: the 32-byte chain d_n; ENGINE: the engine's block hash,
    1..64 bytes), and n tokens. Immutable and hashable (a NamedTuple:
    prefix_keys builds one per token, and a tuple is ~5x cheaper to create
    than a frozen dataclass)."""
    hash: int
    num_tokens: int
    kind: int = KEY_FNV64
    digest: bytes = b""

    def to_pb(self, pb: Any) -> Any:
        return pb.PrefixKey(hash=self.hash, num_tokens=self.num_tokens, kind=self.kind,
                            digest=self.digest)

    @classmethod
    def from_pb(cls, m: Any) -> "PrefixKey":
        return cls(m.hash, m.num_tokens, int(m.kind), bytes(m.digest))


def _scalars_from_pb(cls: Any, m: Any, **overrides: Any) -> Any:
    """Builds dataclass `cls` from message `m` field by field (same names)."""
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name in overrides:
            kw[f.name] = overrides[f.name]
        else:
            kw[f.name] = getattr(m, f.name)
    return cls(**kw)


@dataclass(frozen=True)
class HeadBytes:
    hi_rows: int = 0
    lo_codes: int = 0
    metadata: int = 0
    padding: int = 0
    total: int = 0

    @classmethod
    def from_pb(cls, m: Any) -> "HeadBytes":
        return _scalars_from_pb(cls, m)


@dataclass(frozen=True)
class CompatibilityTags:
    model_id: str
    format: str
    layout_fingerprint: int
    geometry: Geometry
    slot_bytes: int
    format_version: int

    @classmethod
    def from_pb(cls, m: Any) -> "CompatibilityTags":
        return _scalars_from_pb(cls, m, geometry=Geometry.from_pb(m.geometry))

    def to_pb(self, pb: Any) -> Any:
        return pb.CompatibilityTags(model_id=self.model_id, format=self.format,
                                    layout_fingerprint=self.layout_fingerprint,
                                    geometry=self.geometry.to_pb(pb),
                                    slot_bytes=self.slot_bytes,
                                    format_version=self.format_version)


@dataclass(frozen=True)
class ModelStats:
    slot_capacity: int = 0
    slots_allocated: int = 0
    state_capacity_bytes: int = 0
    state_used_bytes: HeadBytes = HeadBytes()
    checkpoint_capacity: int = 0
    checkpoints: int = 0
    checkpoint_capacity_bytes: int = 0
    checkpoint_used_bytes: HeadBytes = HeadBytes()
    checkpoint_aux_bytes: int = 0
    checkpoints_leased: int = 0
    leases_active: int = 0
    lookups_hit: int = 0
    lookups_miss: int = 0
    lookup_tokens_hit: int = 0
    lookup_tokens_miss: int = 0
    evictions: int = 0
    leases_expired: int = 0
    snapshots: int = 0
    restores: int = 0
    bytes_snapshotted: int = 0
    bytes_restored: int = 0
    fp32_equivalent_bytes: int = 0
    # Checkpoints transcoded into / out of the cold checkpoint format.
    checkpoint_transcodes_to_cold: int = 0
    checkpoint_transcodes_from_cold: int = 0

    @classmethod
    def from_pb(cls, m: Any) -> "ModelStats":
        return _scalars_from_pb(cls, m, state_used_bytes=HeadBytes.from_pb(m.state_used_bytes),
                                checkpoint_used_bytes=HeadBytes.from_pb(m.checkpoint_used_bytes))

    @property
    def hit_rate(self) -> float:
        """lookups_hit / (lookups_hit + lookups_miss), 0 before any lookup."""
        n = self.lookups_hit + self.lookups_miss
        return self.lookups_hit / n if n else 0.0


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    geometry: Geometry
    format: str
    tags: CompatibilityTags
    head_bytes: HeadBytes
    slot_bytes: int
    fp32_slot_bytes: int
    payload_bits_per_value: float
    storage_bits_per_value: float
    identity_layout: bool
    stats: ModelStats
    # Format of the cold-tier checkpoints (= format when they are the slot's
    # bytes) and the bytes of one checkpoint in it.
    checkpoint_format: str = ""
    checkpoint_format_slot_bytes: int = 0

    @classmethod
    def from_pb(cls, m: Any) -> "ModelInfo":
        return _scalars_from_pb(cls, m, geometry=Geometry.from_pb(m.geometry),
                                tags=CompatibilityTags.from_pb(m.tags),
                                head_bytes=HeadBytes.from_pb(m.head_bytes),
                                stats=ModelStats.from_pb(m.stats))


@dataclass(frozen=True)
class StatsEntry:
    model_id: str
    format: str
    stats: ModelStats


@dataclass(frozen=True)
class Stats:
    backend: str
    backend_description: str
    state_memory_budget_bytes: int
    state_memory_reserved_bytes: int
    checkpoint_memory_budget_bytes: int
    checkpoint_memory_reserved_bytes: int
    models: Tuple[StatsEntry, ...]
    uptime_seconds: float
    version: str

    @classmethod
    def from_pb(cls, m: Any) -> "Stats":
        models = tuple(StatsEntry(e.model_id, e.format, ModelStats.from_pb(e.stats))
                       for e in m.models)
        return _scalars_from_pb(cls, m, models=models)

    def model(self, model_id: str) -> Optional[StatsEntry]:
        for e in self.models:
            if e.model_id == model_id:
                return e
        return None


@dataclass
class UpdateResult:
    """o: float32 [B, h_v, d_v] (read-only view of the response bytes)."""
    o: Any
    kernel_micros: int
    sequence: int = 0


@dataclass
class PrefillResult:
    """o: float32 [B, T, h_v, d_v] when want_output, else None."""
    o: Any
    kernel_micros: int


@dataclass(frozen=True)
class SnapshotResult:
    key: PrefixKey
    evicted: int


@dataclass
class RestoreResult:
    aux: List[bytes]
    num_tokens: int


@dataclass(frozen=True)
class LookupResult:
    hit: bool
    key: Optional[PrefixKey]
    lease_id: int
    lease_expiry_unix_ms: int
    candidate_tokens: int


@dataclass(frozen=True)
class SnapshotItem:
    """One item of batch_snapshot: `tokens` (the server computes a key_kind
    chain) or `key` (any kind), exactly one."""
    slot: SlotHandle
    tokens: Optional[Sequence[int]] = None
    key: Optional[PrefixKey] = None
    aux: Sequence[bytes] = ()
    key_kind: int = KEY_FNV64


@dataclass(frozen=True)
class RestoreItem:
    """One item of batch_restore (as restore())."""
    slot: SlotHandle
    key: PrefixKey
    lease_id: int = 0


@dataclass(frozen=True)
class LookupItem:
    """One item of batch_lookup_prefix (as lookup_prefix()): `tokens` or
    `keys`, exactly one."""
    tokens: Optional[Sequence[int]] = None
    keys: Optional[Sequence[PrefixKey]] = None
    lease_ms: int = 0
    key_kind: int = KEY_FNV64
    peek: bool = False


@dataclass(frozen=True)
class CalibrationResult:
    """What Calibrate produced (proto CalibrateResponse): layout_file is the
    versioned, checksummed layout for register_model(layout_file=); model is
    set when calibrate() was given model_id (the registered model)."""
    layout_file: bytes = field(repr=False)
    layout_fingerprint: int
    selector: str
    samples: int
    tokens: int
    model: Optional[ModelInfo]

    @classmethod
    def from_pb(cls, m: Any) -> "CalibrationResult":
        return cls(m.layout_file, m.layout_fingerprint, m.selector, m.samples, m.tokens,
                   ModelInfo.from_pb(m.model) if m.HasField("model") else None)


@dataclass(frozen=True)
class ExportedState:
    """A slot's packed bytes and the tags that say how to read them."""
    tags: CompatibilityTags
    packed: bytes = field(repr=False)
