"""Client: a typed wrapper over every RPC of one statecached server.

Each method builds the request, calls the server, and returns dataclasses
(statecache.types) and tensors (numpy, or torch on q's device when q is a
torch tensor); a failed call raises the StateCacheError subclass of its
status code (statecache.errors), and an argument the client rejects raises
InvalidArgument naming it, before any RPC. Thread-safe (one gRPC channel
shared by all calls). statecache.aio.Client has the same methods for asyncio.

    with Client("127.0.0.1:50051") as c:
        c.register_model("m", Geometry("gdn", layers=2, h_qk=2, h_v=4), "fp32",
                         slots=4, checkpoints=4)
        slots = c.allocate_slots("m", 2)
        r = c.update("m", 0, slots, q, k, v, g, beta)  # r.o: float32 [2, 4, 128]
        key = c.snapshot("m", slots[0], tokens=[1, 2, 3]).key
        hit = c.lookup_prefix("m", tokens=[1, 2, 3, 4])
        if hit.hit:
            c.restore("m", slots[1], hit.key, hit.lease_id)
"""
from __future__ import annotations

import os
import warnings
from typing import (Any, Callable, Iterable, List, Optional, Sequence, Tuple,
                    TypeVar, Union)

import grpc

from statecache import _args
from statecache._stubs import pb2, pb2_grpc
from statecache.errors import (InvalidArgument, StateCacheError, Unavailable, error_from_code,
                               error_from_rpc)
from statecache.stream import UpdateStream
from statecache.tensor import output, to_tensor
from statecache.types import (CalibrationResult, CompatibilityTags, ExportedState, Geometry,
                              KEY_ENGINE, KEY_FNV64, KEY_SHA256, LayoutMaps, LookupItem,
                              LookupResult, ModelInfo, PrefillResult, PrefixKey, RestoreItem,
                              RestoreResult, SlotHandle, SnapshotItem, SnapshotResult, Stats,
                              UpdateResult)

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20

T = TypeVar("T")
BytesOrPath = Union[bytes, str, "os.PathLike[str]"]  # file contents, or a path to read


class IdentityLayoutWarning(UserWarning):
    """A DAMP model was registered without a calibrated layout (identity maps:
    the protected hi-precision rows are the first k_hi key channels, not the
    calibrated ones, so accuracy is below what the format gives)."""


def _handles(slots: Sequence[SlotHandle]) -> list:
    return [pb2().SlotHandle(id=s.id, generation=s.generation) for s in slots]


def _read(path_or_bytes: Optional[BytesOrPath], name: str = "file") -> Optional[bytes]:
    if path_or_bytes is None or isinstance(path_or_bytes, bytes):
        return path_or_bytes
    try:
        with open(path_or_bytes, "rb") as f:
            return f.read()
    except (OSError, TypeError) as e:
        raise InvalidArgument(f"{name}: cannot read {path_or_bytes!r} ({e})") from None


def _has_maps(layout: Optional[LayoutMaps]) -> bool:
    return layout is not None and any(len(x) for x in (layout.key_perm, layout.value_order,
                                                         layout.value_scale))


def channel_options(max_message_bytes: int, options: Sequence) -> list:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)] + list(options)


def tls_credentials(tls: bool, root_certificates, private_key, certificate_chain,
                    server_name: Optional[str], opts: list) -> Optional[grpc.ChannelCredentials]:
    """Channel credentials for the TLS arguments of Client (None = plaintext);
    appends the server-name override to opts."""
    tls = tls or any(x is not None for x in (root_certificates, private_key, certificate_chain,
                                              server_name))
    if not tls:
        return None
    if (private_key is None) != (certificate_chain is None):
        raise InvalidArgument("tls: give both private_key and certificate_chain, or neither",
                              "Client")
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.ssl_channel_credentials(
        root_certificates=_read(root_certificates, "root_certificates"),
        private_key=_read(private_key, "private_key"),
        certificate_chain=_read(certificate_chain, "certificate_chain"))


class _Api:
    """The RPC methods shared by Client and statecache.aio.Client: each builds
    its request (checking the arguments) and hands it to _run() with the
    function that turns the response into the result. Client._run calls and
    converts; aio.Client._run returns a coroutine that does."""

    _metadata: Tuple[Tuple[str, str], ...] = ()

    def _run(self, method: str, request: Any, convert: Callable[[Any], T]) -> Any:
        raise NotImplementedError

    # -- models -----------------------------------------------------------------
    def register_model(self, model_id: str, geometry: Geometry, format: str = "damp", *,
                       slots: int, checkpoints: int, layout: Optional[LayoutMaps] = None,
                       layout_file: Optional[BytesOrPath] = None, max_state_bytes: int = 0,
                       max_checkpoint_bytes: int = 0, checkpoint_format: str = "") -> ModelInfo:
        """Registers a model and preallocates its arenas; returns its ModelInfo.

        slots / checkpoints are required: how many live slots and prefix
        checkpoints to preallocate; 0 asks for everything the server's
        remaining state (checkpoint) memory budget buys, capped by
        max_state_bytes (max_checkpoint_bytes), which leaves nothing for a
        second model. layout: calibrated LayoutMaps; layout_file: the bytes
        (or path) of a layout file from calibrate() / `statecachectl
        calibrate --out`. A "damp" / "damp-sr" model with neither uses
        identity maps and warns (IdentityLayoutWarning). checkpoint_format:
        the format of its checkpoints in the host / disk / Redis tiers ("" =
        the server's --checkpoint_format, else `format`). Errors:
        AlreadyExists (id taken), InvalidArgument (geometry, format, layout;
        names the field), ResourceExhausted (budget)."""
        m = "register_model"
        p = pb2()
        req = p.RegisterModelRequest(
            model_id=_args.string(model_id, "model_id", m), geometry=_geometry(geometry, p, m),
            format=_args.string(format, "format", m),
            slots=_args.integer(slots, "slots", m, minimum=0),
            checkpoints=_args.integer(checkpoints, "checkpoints", m, minimum=0),
            max_state_bytes=_args.integer(max_state_bytes, "max_state_bytes", m, minimum=0),
            max_checkpoint_bytes=_args.integer(max_checkpoint_bytes, "max_checkpoint_bytes", m,
                                               minimum=0),
            checkpoint_format=_args.string(checkpoint_format, "checkpoint_format", m,
                                           required=False))
        if layout is not None:
            if not isinstance(layout, LayoutMaps):
                raise InvalidArgument(f"layout: {layout!r} is not a LayoutMaps", m)
            req.layout.CopyFrom(layout.to_pb(p))
        if layout_file is not None:
            req.layout_file = _read(layout_file, "layout_file")
        if format.lower().startswith("damp") and not _has_maps(layout) and not req.layout_file:
            warnings.warn(f"register_model({model_id!r}): {format} without layout= or "
                          f"layout_file= uses identity maps (uncalibrated); pass a layout "
                          f"file from calibrate()", IdentityLayoutWarning, stacklevel=2)
        return self._run("RegisterModel", req, lambda r: ModelInfo.from_pb(r.model))

    def calibrate(self, geometry: Geometry, format: str, trajectories: Iterable[BytesOrPath],
                  *, selector: str = "", sample_every: int = 0, horizon: int = 0,
                  model_id: str = "", slots: int = 0, checkpoints: int = 0,
                  domains: Optional[Sequence[str]] = None) -> CalibrationResult:
        """Calibrates a "damp" / "damp-sr" layout from trajectory files
        (safetensors bytes or paths, kernels/trajectory/TRAJECTORY_FORMAT.md)
        on the server. Returns CalibrationResult; its layout_file goes to
        register_model(layout_file=). With model_id the server also registers
        the model with that layout (slots / checkpoints as in
        register_model; the result's `model`). domains[i]: the calibration
        domain of trajectories[i] (default: the file's own metadata)."""
        m = "calibrate"
        p = pb2()
        files = [_read(t, f"trajectories[{i}]") for i, t in enumerate(trajectories)]
        if not files:
            raise InvalidArgument("trajectories: empty", m)
        if domains is not None and len(domains) != len(files):
            raise InvalidArgument(f"domains: {len(domains)} names for {len(files)} "
                                  f"trajectories", m)
        settings = p.CalibrateSettings(
            geometry=_geometry(geometry, p, m), format=_args.string(format, "format", m),
            selector=_args.string(selector, "selector", m, required=False),
            sample_every=_args.integer(sample_every, "sample_every", m, minimum=0),
            horizon=_args.integer(horizon, "horizon", m, minimum=0),
            model_id=_args.string(model_id, "model_id", m, required=False),
            slots=_args.integer(slots, "slots", m, minimum=0),
            checkpoints=_args.integer(checkpoints, "checkpoints", m, minimum=0))
        reqs = [p.CalibrateRequest(trajectory_file=f, domain=(domains[i] if domains else ""))
                for i, f in enumerate(files)]
        reqs[0].settings.CopyFrom(settings)
        return self._run("Calibrate", reqs, CalibrationResult.from_pb)

    def list_models(self) -> List[ModelInfo]:
        """Every model of this server (of the caller's tenant)."""
        return self._run("ListModels", pb2().ListModelsRequest(),
                         lambda r: [ModelInfo.from_pb(x) for x in r.models])

    def describe_model(self, model_id: str) -> ModelInfo:
        """One model's ModelInfo (NotFound when unknown)."""
        req = pb2().DescribeModelRequest(model_id=_args.string(model_id, "model_id",
                                                               "describe_model"))
        return self._run("DescribeModel", req, ModelInfo.from_pb)

    def drop_model(self, model_id: str, force: bool = False) -> None:
        """Drops a model and frees its arenas. Without force, FailedPrecondition
        while it has allocated slots or active leases."""
        req = pb2().DropModelRequest(model_id=_args.string(model_id, "model_id", "drop_model"),
                                     force=bool(force))
        return self._run("DropModel", req, _none)

    # -- slots ------------------------------------------------------------------
    def allocate_slots(self, model_id: str, count: int) -> List[SlotHandle]:
        """`count` fresh (zeroed) slots; ResourceExhausted when the model has
        fewer free."""
        m = "allocate_slots"
        req = pb2().AllocateSlotsRequest(model_id=_args.string(model_id, "model_id", m),
                                         count=_args.integer(count, "count", m, minimum=1))
        return self._run("AllocateSlots", req,
                         lambda r: [SlotHandle.from_pb(x) for x in r.slots])

    def release_slots(self, model_id: str, slots: Sequence[SlotHandle]) -> None:
        """Frees slots (their handles go stale: FailedPrecondition afterwards)."""
        m = "release_slots"
        req = pb2().ReleaseSlotsRequest(model_id=_args.string(model_id, "model_id", m),
                                        slots=_handles(_args.slots(slots, "slots", m)))
        return self._run("ReleaseSlots", req, _none)

    # -- compute ------------------------------------------------------------------
    @staticmethod
    def update_request(model_id: str, layer: int, slots: Sequence[SlotHandle], q: Any, k: Any,
                       v: Any, g: Any, beta: Any, *, dtype: Optional[str] = None,
                       sequence: int = 0, method: str = "update") -> Any:
        """The UpdateRequest message (shared by update() and UpdateStream).
        q, k, v: [B, h_qk|h_v, d] fp32/bf16/fp16 (dtype forces one, e.g. "bf16"
        for uint16 bits); g: fp32 GDN [B, h_v] / KDA [B, h_v, d_k]; beta: fp32
        [B, h_v]."""
        m = method
        return pb2().UpdateRequest(
            model_id=_args.string(model_id, "model_id", m),
            layer=_args.integer(layer, "layer", m, minimum=0),
            slots=_handles(_args.slots(slots, "slots", m)),
            q=to_tensor(q, dtype, "q", m), k=to_tensor(k, dtype, "k", m),
            v=to_tensor(v, dtype, "v", m), g=to_tensor(g, "fp32", "g", m),
            beta=to_tensor(beta, "fp32", "beta", m), sequence=sequence)

    def update(self, model_id: str, layer: int, slots: Sequence[SlotHandle], q: Any, k: Any,
               v: Any, g: Any, beta: Any, *, dtype: Optional[str] = None) -> UpdateResult:
        """One fused decode step of one layer for a batch of slots: updates
        their states and returns o float32 [B, h_v, d_v] (numpy, or torch on
        q's device when q is a torch tensor)."""
        req = self.update_request(model_id, layer, slots, q, k, v, g, beta, dtype=dtype)
        return self._run("Update", req,
                         lambda r: UpdateResult(output(r.o, q), r.kernel_micros, r.sequence))

    def prefill(self, model_id: str, slots: Sequence[SlotHandle], layer: int, q: Any, k: Any,
                v: Any, g: Any, beta: Any, *, want_output: bool = False,
                dtype: Optional[str] = None) -> PrefillResult:
        """T tokens of one layer: q, k [B, T, h_qk, d_k], v [B, T, h_v, d_v],
        g [B, T, h_v] (KDA [B, T, h_v, d_k]), beta [B, T, h_v]. o [B, T, h_v,
        d_v] when want_output (numpy, or torch on q's device)."""
        m = "prefill"
        p = pb2()
        tokens = p.PrefillTokens(layer=_args.integer(layer, "layer", m, minimum=0),
                                 q=to_tensor(q, dtype, "q", m), k=to_tensor(k, dtype, "k", m),
                                 v=to_tensor(v, dtype, "v", m),
                                 g=to_tensor(g, "fp32", "g", m),
                                 beta=to_tensor(beta, "fp32", "beta", m),
                                 want_output=bool(want_output))
        req = p.PrefillRequest(model_id=_args.string(model_id, "model_id", m),
                               slots=_handles(_args.slots(slots, "slots", m)), tokens=tokens)
        return self._run("Prefill", req, lambda r: PrefillResult(
            output(r.o, q) if r.HasField("o") else None, r.kernel_micros))

    def prefill_states(self, model_id: str, slots: Sequence[SlotHandle],
                       states: Any) -> PrefillResult:
        """Overwrites every layer with FP32 states [B, layers, h_v, d_k, d_v]."""
        m = "prefill_states"
        req = pb2().PrefillRequest(model_id=_args.string(model_id, "model_id", m),
                                   slots=_handles(_args.slots(slots, "slots", m)),
                                   states=to_tensor(states, "fp32", "states", m))
        return self._run("Prefill", req, lambda r: PrefillResult(None, r.kernel_micros))

    # -- prefix cache -------------------------------------------------------------
    def snapshot(self, model_id: str, slot: SlotHandle, *, tokens: Optional[Sequence[int]] = None,
                 key: Optional[PrefixKey] = None, aux: Sequence[bytes] = (),
                 key_kind: int = KEY_FNV64) -> SnapshotResult:
        """Checkpoints `slot` under the prefix given as tokens or as its key
        (exactly one); aux: per-layer bytes returned by restore(). key_kind:
        the chain the server computes from tokens (KEY_FNV64 or KEY_SHA256);
        a key carries its own kind."""
        m = "snapshot"
        p = pb2()
        req = _snapshot_request(p, model_id, SnapshotItem(slot, tokens, key, aux, key_kind), m, "")
        req.model_id = _args.string(model_id, "model_id", m)
        return self._run("Snapshot", req, _snapshot_result)

    def restore(self, model_id: str, slot: SlotHandle, key: PrefixKey,
                lease_id: int = 0) -> RestoreResult:
        """Copies the checkpoint `key` into `slot` (lease_id from
        lookup_prefix keeps it from eviction meanwhile)."""
        m = "restore"
        p = pb2()
        req = _restore_request(p, RestoreItem(slot, key, lease_id), m, "")
        req.model_id = _args.string(model_id, "model_id", m)
        return self._run("Restore", req, _restore_result)

    def lookup_prefix(self, model_id: str, *, tokens: Optional[Sequence[int]] = None,
                      keys: Optional[Sequence[PrefixKey]] = None,
                      lease_ms: int = 0, key_kind: int = KEY_FNV64,
                      peek: bool = False) -> LookupResult:
        """Longest cached prefix among every prefix of `tokens` (a key_kind
        chain) or among `keys`, leased for lease_ms (0 = server default) on
        a hit. peek=True: no lease (lease_id 0), no LRU touch, not counted
        in the lookup statistics."""
        m = "lookup_prefix"
        p = pb2()
        req = _lookup_request(p, LookupItem(tokens, keys, lease_ms, key_kind, peek), m, "")
        req.model_id = _args.string(model_id, "model_id", m)
        return self._run("LookupPrefix", req, _lookup_result)

    def release_lease(self, model_id: str, lease_id: int) -> None:
        """Drops a lease from lookup_prefix without restoring (NotFound when
        it is unknown or expired)."""
        m = "release_lease"
        req = pb2().ReleaseLeaseRequest(model_id=_args.string(model_id, "model_id", m),
                                        lease_id=_args.integer(lease_id, "lease_id", m, minimum=1))
        return self._run("ReleaseLease", req, _none)

    def batch_snapshot(self, model_id: str,
                       items: Sequence[SnapshotItem]) -> List[Union[SnapshotResult, StateCacheError]]:
        """snapshot() of every item in one call: element i is items[i]'s
        SnapshotResult, or its error (a StateCacheError whose message starts
        "items[i].<field>") when that item failed; other items are unaffected."""
        m = "batch_snapshot"
        p = pb2()
        req = p.BatchSnapshotRequest(model_id=_args.string(model_id, "model_id", m))
        for i, it in enumerate(_items(items, SnapshotItem, m)):
            req.items.append(_snapshot_request(p, model_id, it, m, f"items[{i}]."))
        return self._run("BatchSnapshot", req,
                         lambda r: _batch_results(r, _snapshot_result, "BatchSnapshot"))

    def batch_restore(self, model_id: str,
                      items: Sequence[RestoreItem]) -> List[Union[RestoreResult, StateCacheError]]:
        """restore() of every item in one call (per-item results as
        batch_snapshot)."""
        m = "batch_restore"
        p = pb2()
        req = p.BatchRestoreRequest(model_id=_args.string(model_id, "model_id", m))
        for i, it in enumerate(_items(items, RestoreItem, m)):
            req.items.append(_restore_request(p, it, m, f"items[{i}]."))
        return self._run("BatchRestore", req,
                         lambda r: _batch_results(r, _restore_result, "BatchRestore"))

    def batch_lookup_prefix(self, model_id: str, items: Sequence[LookupItem]
                            ) -> List[Union[LookupResult, StateCacheError]]:
        """lookup_prefix() of every item in one call (per-item results as
        batch_snapshot)."""
        m = "batch_lookup_prefix"
        p = pb2()
        req = p.BatchLookupPrefixRequest(model_id=_args.string(model_id, "model_id", m))
        for i, it in enumerate(_items(items, LookupItem, m)):
            req.items.append(_lookup_request(p, it, m, f"items[{i}]."))
        return self._run("BatchLookupPrefix", req,
                         lambda r: _batch_results(r, _lookup_result, "BatchLookupPrefix"))

    # -- transfer -----------------------------------------------------------------
    def export_state(self, model_id: str, slot: SlotHandle) -> ExportedState:
        """The slot's packed bytes and the tags import_state checks."""
        m = "export_state"
        p = pb2()
        req = p.ExportRequest(model_id=_args.string(model_id, "model_id", m),
                              slot=_args.slot(slot, "slot", m).to_pb(p))
        return self._run("Export", req,
                         lambda r: ExportedState(CompatibilityTags.from_pb(r.tags), r.packed))

    def import_state(self, model_id: str, slot: SlotHandle, state: ExportedState) -> None:
        """Writes an export_state() result into `slot` (FailedPrecondition
        when the tags do not match the model)."""
        m = "import_state"
        p = pb2()
        if not isinstance(state, ExportedState):
            raise InvalidArgument(f"state: {type(state).__name__} is not an ExportedState", m)
        req = p.ImportRequest(model_id=_args.string(model_id, "model_id", m),
                              slot=_args.slot(slot, "slot", m).to_pb(p),
                              tags=state.tags.to_pb(p), packed=state.packed)
        return self._run("Import", req, _none)

    def unpack(self, model_id: str, slot: SlotHandle) -> Any:
        """The slot's states decoded to FP32: a flat numpy float32 array of
        layers * h_v * d_k * d_v values, [layers][h_v][d_k][d_v] in natural key
        order (the inverse of prefill_states; bit-exact for fp32)."""
        import numpy as np
        m = "unpack"
        p = pb2()
        req = p.UnpackRequest(model_id=_args.string(model_id, "model_id", m),
                              slot=_args.slot(slot, "slot", m).to_pb(p))
        return self._run("Unpack", req, lambda r: np.frombuffer(r.states, "<f4").copy())

    def unpack_checkpoint(self, model_id: str, key: PrefixKey, lease_id: int = 0) -> Any:
        """The checkpoint `key`'s states decoded to FP32 as unpack() returns a
        slot's, read where the checkpoint is stored without restoring it
        (lease_id from lookup_prefix: read the leased checkpoint; the lease
        is not consumed). NotFound when no tier holds it; ResourceExhausted
        naming max_unpack_bytes when the states exceed the server's limit."""
        import numpy as np
        m = "unpack_checkpoint"
        p = pb2()
        req = p.UnpackRequest(model_id=_args.string(model_id, "model_id", m),
                              key=_args.key(key, "key", m).to_pb(p),
                              lease_id=_args.integer(lease_id, "lease_id", m, minimum=0))
        return self._run("Unpack", req, lambda r: np.frombuffer(r.states, "<f4").copy())

    # -- observability ------------------------------------------------------------
    def get_stats(self, model_id: str = "") -> Stats:
        """Server-wide stats and per-model counters (one model when given)."""
        req = pb2().GetStatsRequest(model_id=_args.string(model_id, "model_id", "get_stats",
                                                          required=False))
        return self._run("GetStats", req, Stats.from_pb)


def _none(_response: Any) -> None:
    return None


def _kind(kind: Any, name: str, method: str) -> int:
    k = _args.integer(kind, name, method)
    if k not in (KEY_FNV64, KEY_SHA256, KEY_ENGINE):
        raise InvalidArgument(f"{name}: {k} is not KEY_FNV64, KEY_SHA256 or KEY_ENGINE", method)
    return k


def _snapshot_request(p: Any, model_id: str, it: SnapshotItem, m: str, at: str) -> Any:
    which = _args.one_of(m, **{f"{at}tokens": it.tokens, f"{at}key": it.key})
    req = p.SnapshotRequest(slot=_args.slot(it.slot, f"{at}slot", m).to_pb(p),
                            aux=_aux(it.aux, m),
                            key_kind=_kind(it.key_kind, f"{at}key_kind", m))
    if which.endswith("tokens"):
        req.tokens.ids.extend(_token_ids(it.tokens, m))
    else:
        req.key.CopyFrom(_args.key(it.key, f"{at}key", m).to_pb(p))
    return req


def _restore_request(p: Any, it: RestoreItem, m: str, at: str) -> Any:
    return p.RestoreRequest(slot=_args.slot(it.slot, f"{at}slot", m).to_pb(p),
                            key=_args.key(it.key, f"{at}key", m).to_pb(p),
                            lease_id=_args.integer(it.lease_id, f"{at}lease_id", m, minimum=0))


def _lookup_request(p: Any, it: LookupItem, m: str, at: str) -> Any:
    which = _args.one_of(m, **{f"{at}tokens": it.tokens, f"{at}keys": it.keys})
    if not isinstance(it.peek, bool):
        raise InvalidArgument(f"{at}peek: {it.peek!r} is not a bool", m)
    req = p.LookupPrefixRequest(lease_ms=_args.integer(it.lease_ms, f"{at}lease_ms", m, minimum=0),
                                key_kind=_kind(it.key_kind, f"{at}key_kind", m), peek=it.peek)
    if which.endswith("tokens"):
        req.tokens.ids.extend(_token_ids(it.tokens, m))
    else:
        if isinstance(it.keys, PrefixKey):
            raise InvalidArgument(f"{at}keys: a PrefixKey, not a sequence of them", m)
        req.keys.keys.extend(_args.key(k, f"{at}keys[{i}]", m).to_pb(p)
                             for i, k in enumerate(it.keys))
    return req


def _snapshot_result(r: Any) -> SnapshotResult:
    return SnapshotResult(PrefixKey.from_pb(r.key), r.evicted)


def _restore_result(r: Any) -> RestoreResult:
    return RestoreResult(list(r.aux), r.num_tokens)


def _lookup_result(r: Any) -> LookupResult:
    return LookupResult(r.hit, PrefixKey.from_pb(r.key) if r.hit else None, r.lease_id,
                        r.lease_expiry_unix_ms, r.candidate_tokens)


def _items(items: Any, cls: Any, method: str) -> List[Any]:
    if isinstance(items, cls) or not isinstance(items, Sequence):
        raise InvalidArgument(f"items: {items!r} is not a sequence of {cls.__name__}", method)
    for i, it in enumerate(items):
        if not isinstance(it, cls):
            raise InvalidArgument(f"items[{i}]: {it!r} is not a {cls.__name__}", method)
    return list(items)


def _batch_results(r: Any, convert: Callable[[Any], T], method: str) -> List[Any]:
    return [error_from_code(x.error.code, x.error.message, method) if x.error.code
            else convert(x.response) for x in r.results]


def _geometry(geometry: Any, p: Any, method: str) -> Any:
    if not isinstance(geometry, Geometry):
        raise InvalidArgument(f"geometry: {geometry!r} is not a Geometry", method)
    try:
        return geometry.to_pb(p)
    except InvalidArgument as e:
        raise InvalidArgument(e.message, method) from None
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"geometry: {e}", method) from None


def _token_ids(tokens: Any, method: str) -> List[int]:
    from statecache.prefix import _tokens_array
    try:
        return _tokens_array(tokens).tolist()
    except InvalidArgument as e:
        raise InvalidArgument(e.message, method) from None


def _aux(aux: Sequence[bytes], method: str) -> List[bytes]:
    if isinstance(aux, (bytes, str)):
        raise InvalidArgument("aux: one bytes object; give a sequence (one per layer)", method)
    out = []
    for i, a in enumerate(aux):
        if not isinstance(a, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"aux[{i}]: {type(a).__name__} is not bytes", method)
        out.append(bytes(a))
    return out


class Client(_Api):
    """One statecached server (blocking calls; statecache.aio.Client for asyncio).

    target: "host:port" or any gRPC target ("unix:/run/statecache.sock").
    timeout: default deadline in seconds for unary calls (None = none).
    token: bearer token, sent as "authorization: Bearer <token>" on every call
      (servers started with --tenants_file require one; UNAUTHENTICATED without).
    tls: use TLS. root_certificates (PEM bytes or a file path; None = system
      roots) verifies the server; private_key + certificate_chain present a
      client certificate (mutual TLS, --tls_client_ca_file on the server);
      server_name overrides the name checked against the certificate.
      Any TLS argument implies tls=True. Without TLS the server accepts only
      loopback / unix-socket connections (unless --allow_insecure_remote).
    channel: use this channel instead of creating one (not closed by close()).
    """

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: Optional[float] = None,
                 token: Optional[str] = None, tls: bool = False,
                 root_certificates: Optional[BytesOrPath] = None,
                 private_key: Optional[BytesOrPath] = None,
                 certificate_chain: Optional[BytesOrPath] = None,
                 server_name: Optional[str] = None,
                 channel: Optional[grpc.Channel] = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[Tuple[str, Any]] = ()):
        self.target = target
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._owns_channel = channel is None
        if channel is None:
            opts = channel_options(max_message_bytes, options)
            creds = tls_credentials(tls, root_certificates, private_key, certificate_chain,
                                    server_name, opts)
            channel = (grpc.secure_channel(target, creds, options=opts) if creds
                       else grpc.insecure_channel(target, options=opts))
        self.channel = channel
        self._stub = pb2_grpc().StateCacheStub(channel)

    # -- plumbing -------------------------------------------------------------
    def close(self) -> None:
        """Closes the channel (unless it was passed in)."""
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self, method: str, request: Any, convert: Callable[[Any], T]) -> T:
        return convert(self._call(method, request))

    def _call(self, method: str, request: Any, timeout: Optional[float] = None) -> Any:
        call = getattr(self._stub, method)
        if isinstance(request, list):  # a client-streaming RPC
            request = iter(request)
        try:
            return call(request, timeout=self.timeout if timeout is None else timeout,
                        metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, method) from None

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel is connected (Unavailable after timeout)."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise Unavailable(f"{self.target} not ready after {timeout}s", "wait_ready") from None

    def health(self, service: str = "", timeout: float = 5.0) -> bool:
        """grpc.health.v1 Check: True when the server (or `service`, e.g.
        "statecache.v1.StateCache") is SERVING."""
        from statecache import _health
        request, _ = _health.messages()
        try:
            r = _health.check_callable(self.channel)(
                request(service=_args.string(service, "service", "health", required=False)),
                timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, "Health.Check") from None
        return r.status == _health.SERVING

    def update_stream(self, model_id: Optional[str] = None, *, max_in_flight: int = 64,
                      send_timeout: Optional[float] = 0.0) -> "UpdateStream":
        """An UpdateStream session (statecache.stream.UpdateStream): at most
        max_in_flight sent requests without recv(); send() beyond that waits
        up to send_timeout seconds (0 = fails at once, None = waits) and
        then raises ResourceExhausted."""
        return UpdateStream(self, model_id, max_in_flight=max_in_flight,
                            send_timeout=send_timeout)


