"""statecache: Python client of statecached (recurrent-state service).

    import statecache as sc
    with sc.Client("127.0.0.1:50051") as c:
        info = c.register_model("qwen", sc.Geometry("gdn", 30, 16, 32, 128, 128), "damp",
                                slots=8, checkpoints=32, layout_file="qwen.layout")
        [slot] = c.allocate_slots("qwen", 1)
        out = c.update("qwen", 0, [slot], q, k, v, g, beta)   # numpy (torch) in, numpy (torch) out
        o = out.o                                               # float32 [1, h_v, d_v]

statecache.aio.Client: the same methods for asyncio workers (grpc.aio).

The gRPC modules (statecache.v1.statecache_pb2 / _pb2_grpc) are generated from
proto/statecache/v1/statecache.proto at install time (setup.py build hook) or
by `python -m statecache._gen` (see README); they are never committed, and
work with protobuf >= 5.26.1 < 8 and grpcio >= 1.66 < 2 (statecache._pbload).
"""
# Let the generated statecache/v1 package live in another sys.path entry (the
# tests generate it into a temporary directory).
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)  # type: ignore[name-defined]

from statecache.errors import (  # noqa: E402
    StateCacheError, Cancelled, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated, error_from_code,
)
from statecache.prefix import (  # noqa: E402
    prefix_keys, prefix_hash, prefix_hashes, block_keys, sha256_prefix_keys, sha256_prefix_hash,
    engine_keys,
)
from statecache.ring import HashRing  # noqa: E402
from statecache.tensor import TensorData, to_tensor, to_numpy, to_torch  # noqa: E402
from statecache.types import (  # noqa: E402
    Geometry, LayoutMaps, SlotHandle, PrefixKey, HeadBytes, CompatibilityTags, ModelInfo,
    ModelStats, StatsEntry, Stats, UpdateResult, PrefillResult, SnapshotResult, RestoreResult,
    LookupResult, ExportedState, CalibrationResult, SnapshotItem, RestoreItem, LookupItem,
    KEY_FNV64, KEY_SHA256, KEY_ENGINE,
)
from statecache.client import Client, IdentityLayoutWarning  # noqa: E402
from statecache.stream import UpdateStream  # noqa: E402
from statecache.sharded import ShardedClient  # noqa: E402

__all__ = [
    "Client", "ShardedClient", "UpdateStream", "HashRing", "TensorData", "to_tensor",
    "to_numpy", "to_torch", "prefix_keys", "prefix_hash", "prefix_hashes", "block_keys",
    "sha256_prefix_keys", "sha256_prefix_hash", "engine_keys", "KEY_FNV64", "KEY_SHA256",
    "KEY_ENGINE", "SnapshotItem", "RestoreItem", "LookupItem",
    "Geometry", "LayoutMaps", "SlotHandle", "PrefixKey", "HeadBytes", "CompatibilityTags",
    "ModelInfo", "ModelStats", "StatsEntry", "Stats", "UpdateResult", "PrefillResult",
    "SnapshotResult", "RestoreResult", "LookupResult", "ExportedState", "CalibrationResult",
    "IdentityLayoutWarning", "error_from_code",
    "StateCacheError", "Cancelled", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
]
