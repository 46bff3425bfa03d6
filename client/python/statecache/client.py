"""Client: a typed wrapper over every RPC of one statecached server.

Each method builds the request, calls the server, and returns dataclasses
(statecache.types) and numpy arrays; a failed call raises the
StateCacheError subclass of its status code (statecache.errors). Thread-safe
(one gRPC channel shared by all calls).

    with Client("127.0.0.1:50051") as c:
        c.register_model("m", Geometry("gdn", layers=2, h_qk=2, h_v=4), format="damp")
        slots = c.allocate_slots("m", 2)
        r = c.update("m", 0, slots, q, k, v, g, beta)  # r.o: float32 [2, 4, 128]
        key = c.snapshot("m", slots[0], tokens=[1, 2, 3]).key
        hit = c.lookup_prefix("m", tokens=[1, 2, 3, 4])
        if hit.hit:
            c.restore("m", slots[1], hit.key, hit.lease_id)
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

import grpc

from statecache._stubs import pb2, pb2_grpc
from statecache.errors import error_from_rpc
from statecache.tensor import to_numpy, to_tensor
from statecache.types import (CompatibilityTags, ExportedState, Geometry, LayoutMaps,
                              LookupResult, ModelInfo, PrefillResult, PrefixKey,
                              RestoreResult, SlotHandle, SnapshotResult, Stats, UpdateResult)

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20


def _handles(slots: Iterable[SlotHandle]):
    return [pb2().SlotHandle(id=s.id, generation=s.generation) for s in slots]


def _read(path_or_bytes) -> Optional[bytes]:
    if path_or_bytes is None or isinstance(path_or_bytes, bytes):
        return path_or_bytes
    with open(path_or_bytes, "rb") as f:
        return f.read()


class Client:
    """One statecached server.

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
                 root_certificates=None, private_key=None, certificate_chain=None,
                 server_name: Optional[str] = None,
                 channel: Optional[grpc.Channel] = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence = ()):
        self.target = target
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._owns_channel = channel is None
        if channel is None:
            opts = [("grpc.max_send_message_length", max_message_bytes),
                    ("grpc.max_receive_message_length", max_message_bytes)] + list(options)
            tls = tls or any(x is not None for x in (root_certificates, private_key,
                                                      certificate_chain, server_name))
            if tls:
                if (private_key is None) != (certificate_chain is None):
                    raise ValueError("tls: give both private_key and certificate_chain, or neither")
                creds = grpc.ssl_channel_credentials(
                    root_certificates=_read(root_certificates), private_key=_read(private_key),
                    certificate_chain=_read(certificate_chain))
                if server_name:
                    opts.append(("grpc.ssl_target_name_override", server_name))
                channel = grpc.secure_channel(target, creds, options=opts)
            else:
                channel = grpc.insecure_channel(target, options=opts)
        self.channel = channel
        self._stub = pb2_grpc().StateCacheStub(channel)

    # -- plumbing -------------------------------------------------------------
    def close(self) -> None:
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request, timeout: Optional[float] = None):
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, method) from None

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel is connected (Unavailable after timeout)."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            from statecache.errors import Unavailable
            raise Unavailable(f"{self.target} not ready after {timeout}s", "wait_ready") from None

    def health(self, service: str = "", timeout: float = 5.0) -> bool:
        """grpc.health.v1 Check: True when the server (or `service`, e.g.
        "statecache.v1.StateCache") is SERVING."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout,
                           metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, "Health.Check") from None
        return r.status == health_pb2.HealthCheckResponse.SERVING

    # -- models -----------------------------------------------------------------
    def register_model(self, model_id: str, geometry: Geometry, format: str = "damp", *,
                       layout: Optional[LayoutMaps] = None, slots: int = 0,
                       checkpoints: int = 0, max_state_bytes: int = 0,
                       max_checkpoint_bytes: int = 0) -> ModelInfo:
        """Registers a model and preallocates its arenas (slots / checkpoints
        0 = what the server's remaining budget buys, capped by max_*_bytes)."""
        p = pb2()
        req = p.RegisterModelRequest(model_id=model_id, geometry=geometry.to_pb(p), format=format,
                                     slots=slots, checkpoints=checkpoints,
                                     max_state_bytes=max_state_bytes,
                                     max_checkpoint_bytes=max_checkpoint_bytes)
        if layout is not None:
            req.layout.CopyFrom(layout.to_pb(p))
        return ModelInfo.from_pb(self._call("RegisterModel", req).model)

    def list_models(self) -> List[ModelInfo]:
        return [ModelInfo.from_pb(m)
                for m in self._call("ListModels", pb2().ListModelsRequest()).models]

    def describe_model(self, model_id: str) -> ModelInfo:
        return ModelInfo.from_pb(
            self._call("DescribeModel", pb2().DescribeModelRequest(model_id=model_id)))

    def drop_model(self, model_id: str, force: bool = False) -> None:
        self._call("DropModel", pb2().DropModelRequest(model_id=model_id, force=force))

    # -- slots ------------------------------------------------------------------
    def allocate_slots(self, model_id: str, count: int) -> List[SlotHandle]:
        r = self._call("AllocateSlots", pb2().AllocateSlotsRequest(model_id=model_id, count=count))
        return [SlotHandle.from_pb(s) for s in r.slots]

    def release_slots(self, model_id: str, slots: Sequence[SlotHandle]) -> None:
        self._call("ReleaseSlots",
                   pb2().ReleaseSlotsRequest(model_id=model_id, slots=_handles(slots)))

    # -- compute ------------------------------------------------------------------
    @staticmethod
    def update_request(model_id: str, layer: int, slots: Sequence[SlotHandle], q, k, v, g, beta,
                       *, dtype=None, sequence: int = 0):
        """The UpdateRequest message (shared by update() and UpdateStream).
        q, k, v: [B, h_qk|h_v, d] fp32/bf16/fp16 (dtype forces one, e.g. "bf16"
        for uint16 bits); g: fp32 GDN [B, h_v] / KDA [B, h_v, d_k]; beta: fp32
        [B, h_v]."""
        return pb2().UpdateRequest(
            model_id=model_id, layer=layer, slots=_handles(slots),
            q=to_tensor(q, dtype, "q"), k=to_tensor(k, dtype, "k"), v=to_tensor(v, dtype, "v"),
            g=to_tensor(g, "fp32", "g"), beta=to_tensor(beta, "fp32", "beta"), sequence=sequence)

    def update(self, model_id: str, layer: int, slots: Sequence[SlotHandle], q, k, v, g, beta,
               *, dtype=None) -> UpdateResult:
        """One fused decode step of one layer; returns o float32 [B, h_v, d_v]."""
        r = self._call("Update", self.update_request(model_id, layer, slots, q, k, v, g, beta,
                                                     dtype=dtype))
        return UpdateResult(to_numpy(r.o), r.kernel_micros, r.sequence)

    def update_stream(self, model_id: Optional[str] = None, *, max_in_flight: int = 64):
        """An UpdateStream session (see statecache.stream.UpdateStream)."""
        from statecache.stream import UpdateStream
        return UpdateStream(self, model_id, max_in_flight=max_in_flight)

    def prefill(self, model_id: str, slots: Sequence[SlotHandle], layer: int, q, k, v, g, beta,
                *, want_output: bool = False, dtype=None) -> PrefillResult:
        """T tokens of one layer: q, k [B, T, h_qk, d_k], v [B, T, h_v, d_v],
        g [B, T, h_v] (KDA [B, T, h_v, d_k]), beta [B, T, h_v]."""
        p = pb2()
        tokens = p.PrefillTokens(layer=layer, q=to_tensor(q, dtype, "q"),
                                 k=to_tensor(k, dtype, "k"), v=to_tensor(v, dtype, "v"),
                                 g=to_tensor(g, "fp32", "g"), beta=to_tensor(beta, "fp32", "beta"),
                                 want_output=want_output)
        r = self._call("Prefill", p.PrefillRequest(model_id=model_id, slots=_handles(slots),
                                                   tokens=tokens))
        return PrefillResult(to_numpy(r.o) if r.HasField("o") else None, r.kernel_micros)

    def prefill_states(self, model_id: str, slots: Sequence[SlotHandle], states) -> PrefillResult:
        """Overwrites every layer with FP32 states [B, layers, h_v, d_k, d_v]."""
        r = self._call("Prefill", pb2().PrefillRequest(
            model_id=model_id, slots=_handles(slots), states=to_tensor(states, "fp32", "states")))
        return PrefillResult(None, r.kernel_micros)

    # -- prefix cache -------------------------------------------------------------
    def snapshot(self, model_id: str, slot: SlotHandle, *, tokens: Optional[Sequence[int]] = None,
                 key: Optional[PrefixKey] = None,
                 aux: Sequence[bytes] = ()) -> SnapshotResult:
        """Checkpoints `slot` under the prefix given as tokens or as its key."""
        p = pb2()
        if (tokens is None) == (key is None):
            raise ValueError("snapshot: give exactly one of tokens, key")
        req = p.SnapshotRequest(model_id=model_id, slot=slot.to_pb(p), aux=list(aux))
        if tokens is not None:
            req.tokens.ids.extend(int(t) for t in tokens)
        else:
            req.key.CopyFrom(key.to_pb(p))
        r = self._call("Snapshot", req)
        return SnapshotResult(PrefixKey.from_pb(r.key), r.evicted)

    def restore(self, model_id: str, slot: SlotHandle, key: PrefixKey,
                lease_id: int = 0) -> RestoreResult:
        p = pb2()
        r = self._call("Restore", p.RestoreRequest(model_id=model_id, slot=slot.to_pb(p),
                                                   key=key.to_pb(p), lease_id=lease_id))
        return RestoreResult(list(r.aux), r.num_tokens)

    def lookup_prefix(self, model_id: str, *, tokens: Optional[Sequence[int]] = None,
                      keys: Optional[Sequence[PrefixKey]] = None,
                      lease_ms: int = 0) -> LookupResult:
        """Longest cached prefix among every prefix of `tokens` (or among
        `keys`), leased for lease_ms (0 = server default) on a hit."""
        p = pb2()
        if (tokens is None) == (keys is None):
            raise ValueError("lookup_prefix: give exactly one of tokens, keys")
        req = p.LookupPrefixRequest(model_id=model_id, lease_ms=lease_ms)
        if tokens is not None:
            req.tokens.ids.extend(int(t) for t in tokens)
        else:
            req.keys.keys.extend(k.to_pb(p) for k in keys)
        r = self._call("LookupPrefix", req)
        return LookupResult(r.hit, PrefixKey.from_pb(r.key) if r.hit else None, r.lease_id,
                            r.lease_expiry_unix_ms, r.candidate_tokens)

    # -- transfer -----------------------------------------------------------------
    def export_state(self, model_id: str, slot: SlotHandle) -> ExportedState:
        p = pb2()
        r = self._call("Export", p.ExportRequest(model_id=model_id, slot=slot.to_pb(p)))
        return ExportedState(CompatibilityTags.from_pb(r.tags), r.packed)

    def import_state(self, model_id: str, slot: SlotHandle, state: ExportedState) -> None:
        p = pb2()
        self._call("Import", p.ImportRequest(model_id=model_id, slot=slot.to_pb(p),
                                             tags=state.tags.to_pb(p), packed=state.packed))

    # -- observability ------------------------------------------------------------
    def get_stats(self, model_id: str = "") -> Stats:
        return Stats.from_pb(self._call("GetStats", pb2().GetStatsRequest(model_id=model_id)))
