"""statecache: Python client of statecached (recurrent-state service).

    import statecache as sc
    with sc.Client("127.0.0.1:50051") as c:
        info = c.register_model("qwen", sc.Geometry("gdn", 30, 16, 32, 128, 128), "damp")
        [slot] = c.allocate_slots("qwen", 1)
        out = c.update("qwen", 0, [slot], q, k, v, g, beta)   # numpy in, numpy out
        o = out.o                                               # float32 [1, h_v, d_v]

The gRPC stubs (statecache.v1.statecache_pb2 / _pb2_grpc) are generated from
proto/statecache/v1/statecache.proto at install time (setup.py build hook) or
by `python -m statecache._gen` (see README); they are never committed.
"""
# Let the generated statecache/v1 package live in another sys.path entry (the
# tests generate it into a temporary directory).
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)  # type: ignore[name-defined]

from statecache.errors import (  # noqa: E402
    StateCacheError, InvalidArgument, NotFound, AlreadyExists, FailedPrecondition,
    ResourceExhausted, Unavailable, DeadlineExceeded, Cancelled, Internal, Unimplemented,
    error_from_code,
)
from statecache.prefix import prefix_keys, prefix_hash  # noqa: E402
from statecache.ring import HashRing  # noqa: E402
from statecache.tensor import TensorData, to_tensor, to_numpy, to_torch  # noqa: E402
from statecache.types import (  # noqa: E402
    Geometry, LayoutMaps, SlotHandle, PrefixKey, HeadBytes, CompatibilityTags, ModelInfo,
    ModelStats, StatsEntry, Stats, UpdateResult, PrefillResult, SnapshotResult, RestoreResult,
    LookupResult, ExportedState,
)
from statecache.client import Client  # noqa: E402
from statecache.stream import UpdateStream  # noqa: E402
from statecache.sharded import ShardedClient  # noqa: E402

__all__ = [
    "Client", "ShardedClient", "UpdateStream", "HashRing", "TensorData", "to_tensor",
    "to_numpy", "to_torch", "prefix_keys", "prefix_hash", "Geometry", "LayoutMaps",
    "SlotHandle", "PrefixKey", "HeadBytes", "CompatibilityTags", "ModelInfo", "ModelStats",
    "StatsEntry", "Stats", "UpdateResult", "PrefillResult", "SnapshotResult", "RestoreResult",
    "LookupResult", "ExportedState", "StateCacheError", "InvalidArgument", "NotFound",
    "AlreadyExists", "FailedPrecondition", "ResourceExhausted", "Unavailable",
    "DeadlineExceeded", "Cancelled", "Internal", "Unimplemented", "error_from_code",
]
