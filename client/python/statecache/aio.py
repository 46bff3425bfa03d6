"""statecache.aio: the asyncio client, on grpc.aio.

The same methods, arguments, results and errors as statecache.Client (one
request builder and one response conversion serve both), awaited:

    import statecache.aio as sca

    async with sca.Client("127.0.0.1:50051", timeout=10) as c:
        [slot] = await c.allocate_slots("m", 1)
        o = (await c.update("m", 0, [slot], q, k, v, g, beta)).o
        async with c.update_stream("m") as s:
            seq = await s.send(0, [slot], q, k, v, g, beta)
            o = (await s.recv()).o

Create and use a Client inside one running event loop (grpc.aio binds its
channel to the loop).
"""
from __future__ import annotations

import asyncio
from typing import (Any, Awaitable, Callable, Iterable, List, Optional, Sequence, Tuple, TypeVar,
                    Union)

import grpc
import grpc.aio

from statecache._stubs import pb2_grpc
from statecache.client import (DEFAULT_MAX_MESSAGE_BYTES, BytesOrPath, _Api, channel_options,
                               tls_credentials)
from statecache.client import Client as _SyncClient
from statecache.errors import InvalidArgument, StateCacheError, Unavailable, error_from_rpc
from statecache.stream import check_flow_args, full_error, result
from statecache.types import (KEY_FNV64, CalibrationResult, ExportedState, Geometry, LayoutMaps,
                              LookupItem, LookupResult, ModelInfo, PrefillResult, PrefixKey,
                              RestoreItem, RestoreResult, SlotHandle, SnapshotItem,
                              SnapshotResult, Stats, UpdateResult)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Client", "UpdateStream"]


def _doc(f: F) -> F:
    """Gives an async method the docstring of the same-named Client method."""
    f.__doc__ = getattr(_SyncClient, f.__name__).__doc__
    return f


class Client(_Api):
    """One statecached server, for asyncio (see statecache.Client for the
    arguments; `channel` is a grpc.aio.Channel here)."""

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: Optional[float] = None,
                 token: Optional[str] = None, tls: bool = False,
                 root_certificates: Optional[BytesOrPath] = None,
                 private_key: Optional[BytesOrPath] = None,
                 certificate_chain: Optional[BytesOrPath] = None,
                 server_name: Optional[str] = None,
                 channel: Optional[grpc.aio.Channel] = None,
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
            channel = (grpc.aio.secure_channel(target, creds, options=opts) if creds
                       else grpc.aio.insecure_channel(target, options=opts))
        self.channel = channel
        self._stub = pb2_grpc().StateCacheStub(channel)

    def _run(self, method: str, request: Any, convert: Callable[[Any], T]) -> Awaitable[T]:
        return self._call(method, request, convert)

    async def _call(self, method: str, request: Any, convert: Callable[[Any], T]) -> T:
        call = getattr(self._stub, method)
        if isinstance(request, list):  # a client-streaming RPC
            request = iter(request)
        try:
            response = await call(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, method) from None
        return convert(response)

    async def close(self) -> None:
        """Closes the channel (unless it was passed in)."""
        if self._owns_channel:
            await self.channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Waits until the channel is connected (Unavailable after timeout)."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise Unavailable(f"{self.target} not ready after {timeout}s", "wait_ready") from None

    @_doc
    async def health(self, service: str = "", timeout: float = 5.0) -> bool:
        from statecache import _args, _health
        request, _ = _health.messages()
        try:
            r = await _health.check_callable(self.channel)(
                request(service=_args.string(service, "service", "health", required=False)),
                timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, "Health.Check") from None
        return r.status == _health.SERVING

    def update_stream(self, model_id: Optional[str] = None, *, max_in_flight: int = 64,
                      send_timeout: Optional[float] = 0.0) -> "UpdateStream":
        """An asyncio UpdateStream session (same flow control as
        statecache.stream.UpdateStream; send() and recv() are awaited)."""
        return UpdateStream(self, model_id, max_in_flight=max_in_flight,
                            send_timeout=send_timeout)

    # The RPC methods of _Api, awaited (their bodies return coroutines here).
    @_doc
    async def register_model(self, model_id: str, geometry: Geometry, format: str = "damp", *,
                             slots: int, checkpoints: int, layout: Optional[LayoutMaps] = None,
                             layout_file: Optional[BytesOrPath] = None,
                             max_state_bytes: int = 0,
                             max_checkpoint_bytes: int = 0,
                             checkpoint_format: str = "") -> ModelInfo:
        return await super().register_model(
            model_id, geometry, format, slots=slots, checkpoints=checkpoints, layout=layout,
            layout_file=layout_file, max_state_bytes=max_state_bytes,
            max_checkpoint_bytes=max_checkpoint_bytes, checkpoint_format=checkpoint_format)

    @_doc
    async def calibrate(self, geometry: Geometry, format: str,
                        trajectories: Iterable[BytesOrPath], **kw: Any) -> CalibrationResult:
        return await super().calibrate(geometry, format, trajectories, **kw)

    @_doc
    async def list_models(self) -> List[ModelInfo]:
        return await super().list_models()

    @_doc
    async def describe_model(self, model_id: str) -> ModelInfo:
        return await super().describe_model(model_id)

    @_doc
    async def drop_model(self, model_id: str, force: bool = False) -> None:
        return await super().drop_model(model_id, force)

    @_doc
    async def allocate_slots(self, model_id: str, count: int) -> List[SlotHandle]:
        return await super().allocate_slots(model_id, count)

    @_doc
    async def release_slots(self, model_id: str, slots: Sequence[SlotHandle]) -> None:
        return await super().release_slots(model_id, slots)

    @_doc
    async def update(self, model_id: str, layer: int, slots: Sequence[SlotHandle], q: Any,
                     k: Any, v: Any, g: Any, beta: Any, *,
                     dtype: Optional[str] = None) -> UpdateResult:
        return await super().update(model_id, layer, slots, q, k, v, g, beta, dtype=dtype)

    @_doc
    async def prefill(self, model_id: str, slots: Sequence[SlotHandle], layer: int, q: Any,
                      k: Any, v: Any, g: Any, beta: Any, *, want_output: bool = False,
                      dtype: Optional[str] = None) -> PrefillResult:
        return await super().prefill(model_id, slots, layer, q, k, v, g, beta,
                                     want_output=want_output, dtype=dtype)

    @_doc
    async def prefill_states(self, model_id: str, slots: Sequence[SlotHandle],
                             states: Any) -> PrefillResult:
        return await super().prefill_states(model_id, slots, states)

    @_doc
    async def snapshot(self, model_id: str, slot: SlotHandle, *,
                       tokens: Optional[Sequence[int]] = None, key: Optional[PrefixKey] = None,
                       aux: Sequence[bytes] = (), key_kind: int = KEY_FNV64) -> SnapshotResult:
        return await super().snapshot(model_id, slot, tokens=tokens, key=key, aux=aux,
                                      key_kind=key_kind)

    @_doc
    async def restore(self, model_id: str, slot: SlotHandle, key: PrefixKey,
                      lease_id: int = 0) -> RestoreResult:
        return await super().restore(model_id, slot, key, lease_id)

    @_doc
    async def lookup_prefix(self, model_id: str, *, tokens: Optional[Sequence[int]] = None,
                            keys: Optional[Sequence[PrefixKey]] = None,
                            lease_ms: int = 0, key_kind: int = KEY_FNV64,
                            peek: bool = False) -> LookupResult:
        return await super().lookup_prefix(model_id, tokens=tokens, keys=keys,
                                           lease_ms=lease_ms, key_kind=key_kind, peek=peek)

    @_doc
    async def release_lease(self, model_id: str, lease_id: int) -> None:
        return await super().release_lease(model_id, lease_id)

    @_doc
    async def batch_snapshot(self, model_id: str, items: Sequence[SnapshotItem]
                             ) -> List[Union[SnapshotResult, StateCacheError]]:
        return await super().batch_snapshot(model_id, items)

    @_doc
    async def batch_restore(self, model_id: str, items: Sequence[RestoreItem]
                            ) -> List[Union[RestoreResult, StateCacheError]]:
        return await super().batch_restore(model_id, items)

    @_doc
    async def batch_lookup_prefix(self, model_id: str, items: Sequence[LookupItem]
                                  ) -> List[Union[LookupResult, StateCacheError]]:
        return await super().batch_lookup_prefix(model_id, items)

    @_doc
    async def export_state(self, model_id: str, slot: SlotHandle) -> ExportedState:
        return await super().export_state(model_id, slot)

    @_doc
    async def import_state(self, model_id: str, slot: SlotHandle, state: ExportedState) -> None:
        return await super().import_state(model_id, slot, state)

    @_doc
    async def unpack(self, model_id: str, slot: SlotHandle) -> Any:
        return await super().unpack(model_id, slot)

    @_doc
    async def unpack_checkpoint(self, model_id: str, key: PrefixKey, lease_id: int = 0) -> Any:
        return await super().unpack_checkpoint(model_id, key, lease_id)

    @_doc
    async def get_stats(self, model_id: str = "") -> Stats:
        return await super().get_stats(model_id)


class UpdateStream:
    """An UpdateStream session on grpc.aio: `await send(...)` returns the
    sequence number, `await recv()` the next UpdateResult in order (a failed
    request raises its StateCacheError; the stream goes on). At most
    max_in_flight requests unanswered: send() waits up to send_timeout
    seconds (0 = fails at once, None = waits) for a recv() in another task,
    then raises ResourceExhausted."""

    def __init__(self, client: Client, model_id: Optional[str] = None, *,
                 max_in_flight: int = 64, send_timeout: Optional[float] = 0.0):
        check_flow_args(max_in_flight, send_timeout, "update_stream")
        self._client = client
        self._model_id = model_id
        self.max_in_flight = int(max_in_flight)
        self.send_timeout = send_timeout
        self._slots = asyncio.Semaphore(self.max_in_flight)
        self._likes: List[Any] = []
        self._next_seq = 0
        self._closed = False
        self._call = client._stub.UpdateStream(metadata=client._metadata)

    async def send(self, layer: int, slots: Sequence[SlotHandle], q: Any, k: Any, v: Any,
                   g: Any, beta: Any, *, model_id: Optional[str] = None,
                   dtype: Optional[str] = None) -> int:
        """Writes one update; returns its sequence number."""
        mid = model_id or self._model_id
        if not mid:
            raise InvalidArgument("model_id: not given to update_stream() nor send()",
                                  "UpdateStream.send")
        req = self._client.update_request(mid, layer, slots, q, k, v, g, beta, dtype=dtype,
                                          method="UpdateStream.send")
        if self._closed:
            raise StateCacheError("stream closed", "UpdateStream")
        if not self._slots.locked():
            await self._slots.acquire()  # free: does not wait
        elif self.send_timeout == 0:
            raise full_error(self.max_in_flight, 0)
        else:
            try:
                await asyncio.wait_for(self._slots.acquire(), self.send_timeout)
            except asyncio.TimeoutError:
                raise full_error(self.max_in_flight, self.send_timeout) from None
        seq = req.sequence = self._next_seq
        self._next_seq += 1
        self._likes.append(q)
        try:
            await self._call.write(req)
        except grpc.RpcError as e:
            self._closed = True
            raise error_from_rpc(e, "UpdateStream") from None
        return seq

    async def recv(self) -> UpdateResult:
        """The next response in order."""
        try:
            r = await self._call.read()
        except grpc.RpcError as e:
            self._closed = True
            raise error_from_rpc(e, "UpdateStream") from None
        finally:
            self._slots.release()
        if r is grpc.aio.EOF:
            self._closed = True
            raise StateCacheError("stream ended by the server", "UpdateStream")
        return result(r, self._likes.pop(0) if self._likes else None)

    async def update(self, layer: int, slots: Sequence[SlotHandle], q: Any, k: Any, v: Any,
                     g: Any, beta: Any, **kw: Any) -> UpdateResult:
        """send() + recv() (only when nothing else is in flight)."""
        await self.send(layer, slots, q, k, v, g, beta, **kw)
        return await self.recv()

    async def close(self) -> None:
        """Half-closes the stream and drains it (unreceived responses are dropped)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._call.done_writing()
            while await self._call.read() is not grpc.aio.EOF:
                pass
        except grpc.RpcError:
            pass

    async def __aenter__(self) -> "UpdateStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
