"""UpdateStream: one long-lived bidirectional stream of decode updates.

A worker opens one stream and sends one message per layer per step. send()
queues a request and returns its sequence number without waiting for the
server; recv() returns the next response in order (the server answers in
order). A request that fails raises its StateCacheError from recv() and the
stream goes on; a failure of the stream itself (server gone) raises from
send() / recv() and closes the session. update() is send() + recv().

Flow control: at most `max_in_flight` requests (default 64) may be sent and
not yet received. send() beyond that waits up to `send_timeout` seconds for
a recv() on another thread (default 0: fails at once; None: waits without
limit) and then raises ResourceExhausted naming max_in_flight, so a
single-threaded caller that forgets recv() gets an error, not a hang.

    with client.update_stream("m") as s:
        for layer in range(layers):
            o = s.update(layer, slots, q, k, v, g, beta).o
        # or pipelined: seqs = [s.send(l, ...) for l in ...]; [s.recv() for _ in seqs]
"""
from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import grpc

from statecache import _args
from statecache.errors import (InvalidArgument, ResourceExhausted, StateCacheError,
                               error_from_code, error_from_rpc)
from statecache.tensor import output
from statecache.types import SlotHandle, UpdateResult

if TYPE_CHECKING:
    from statecache.client import Client

_CLOSE = object()


def check_flow_args(max_in_flight: Any, send_timeout: Any, method: str) -> None:
    """InvalidArgument for a max_in_flight < 1 or a negative send_timeout."""
    _args.integer(max_in_flight, "max_in_flight", method, minimum=1)
    if send_timeout is not None and (isinstance(send_timeout, bool) or
                                     not isinstance(send_timeout, (int, float))
                                     or send_timeout < 0):
        raise InvalidArgument(f"send_timeout: {send_timeout!r} is not None or a number >= 0",
                              method)


def full_error(max_in_flight: int, send_timeout: Optional[float]) -> ResourceExhausted:
    waited = f" after waiting {send_timeout}s" if send_timeout else ""
    return ResourceExhausted(f"max_in_flight: {max_in_flight} requests sent without recv()"
                             f"{waited}; call recv() (or raise max_in_flight / send_timeout)",
                             "UpdateStream.send")


def result(r: Any, like: Any) -> UpdateResult:
    """An UpdateResponse as UpdateResult, or its error raised."""
    if r.HasField("error") and r.error.code != 0:
        raise error_from_code(r.error.code, r.error.message, f"UpdateStream[seq={r.sequence}]")
    return UpdateResult(output(r.o, like), r.kernel_micros, r.sequence)


class UpdateStream:
    """A bidirectional UpdateStream session of one Client (see the module
    docstring). send() and recv() may run on different threads; one thread
    each."""

    def __init__(self, client: "Client", model_id: Optional[str] = None, *,
                 max_in_flight: int = 64, send_timeout: Optional[float] = 0.0):
        check_flow_args(max_in_flight, send_timeout, "update_stream")
        self._client = client
        self._model_id = model_id
        self.max_in_flight = int(max_in_flight)
        self.send_timeout = send_timeout
        self._requests: "queue.Queue[Any]" = queue.Queue()
        self._in_flight = threading.Semaphore(self.max_in_flight)
        self._likes: "queue.Queue[Any]" = queue.Queue()  # q of each request, for output()
        self._next_seq = 0
        self._lock = threading.Lock()
        self._closed = False
        self._responses = client._stub.UpdateStream(self._request_iter(),
                                                    metadata=client._metadata)

    def _request_iter(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is _CLOSE:
                return
            yield item

    def send(self, layer: int, slots: Sequence[SlotHandle], q: Any, k: Any, v: Any, g: Any,
             beta: Any, *, model_id: Optional[str] = None, dtype: Optional[str] = None) -> int:
        """Queues one update and returns its sequence number. ResourceExhausted
        when max_in_flight requests are unanswered (after send_timeout);
        InvalidArgument for bad arguments (nothing is sent)."""
        mid = model_id or self._model_id
        if not mid:
            raise InvalidArgument("model_id: not given to update_stream() nor send()",
                                  "UpdateStream.send")
        req = self._client.update_request(mid, layer, slots, q, k, v, g, beta, dtype=dtype,
                                          method="UpdateStream.send")
        if self._closed:
            raise StateCacheError("stream closed", "UpdateStream")
        timeout = self.send_timeout
        if not self._in_flight.acquire(blocking=timeout != 0, timeout=timeout or None):
            raise full_error(self.max_in_flight, timeout)
        with self._lock:
            if self._closed:
                self._in_flight.release()
                raise StateCacheError("stream closed", "UpdateStream")
            seq = self._next_seq
            self._next_seq += 1
            req.sequence = seq
            self._likes.put(q)
            self._requests.put(req)
        return seq

    def recv(self) -> UpdateResult:
        """The next response in order (blocks until it arrives). Raises its
        StateCacheError when that request failed (the stream stays open)."""
        try:
            r = next(self._responses)
        except StopIteration:
            self._closed = True
            raise StateCacheError("stream ended by the server", "UpdateStream") from None
        except grpc.RpcError as e:
            self._closed = True
            raise error_from_rpc(e, "UpdateStream") from None
        finally:
            self._in_flight.release()
        like = self._likes.get_nowait() if not self._likes.empty() else None
        return result(r, like)

    def update(self, layer: int, slots: Sequence[SlotHandle], q: Any, k: Any, v: Any, g: Any,
               beta: Any, **kw: Any) -> UpdateResult:
        """send() + recv() (only when nothing else is in flight)."""
        self.send(layer, slots, q, k, v, g, beta, **kw)
        return self.recv()

    def close(self) -> None:
        """Half-closes the stream and waits for the server to finish it.
        Unreceived responses are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._requests.put(_CLOSE)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError:
            pass

    def __enter__(self) -> "UpdateStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
