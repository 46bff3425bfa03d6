"""UpdateStream: one long-lived bidirectional stream of decode updates.

A worker opens one stream and sends one message per layer per step. send()
queues a request and returns its sequence number without waiting; recv()
returns the next response in order (the server answers in order). A request
that fails raises its StateCacheError from recv() and the stream goes on; a
failure of the stream itself (server gone) raises from send() / recv() and
closes the session. update() is send() + recv(). At most max_in_flight
requests are queued unanswered (send() blocks beyond that).

    with client.update_stream("m") as s:
        for layer in range(layers):
            o = s.update(layer, slots, q, k, v, g, beta).o
        # or pipelined: seqs = [s.send(l, ...) for l in ...]; [s.recv() for _ in seqs]
"""
from __future__ import annotations

import queue
import threading
from typing import Optional, Sequence

import grpc

from statecache.errors import StateCacheError, error_from_code, error_from_rpc
from statecache.tensor import to_numpy
from statecache.types import SlotHandle, UpdateResult

_CLOSE = object()


class UpdateStream:
    def __init__(self, client, model_id: Optional[str] = None, *, max_in_flight: int = 64):
        self._client = client
        self._model_id = model_id
        self._requests: "queue.Queue" = queue.Queue()
        self._in_flight = threading.Semaphore(max_in_flight)
        self._next_seq = 0
        self._lock = threading.Lock()
        self._closed = False
        self._responses = client._stub.UpdateStream(self._request_iter(),
                                                    metadata=client._metadata)

    def _request_iter(self):
        while True:
            item = self._requests.get()
            if item is _CLOSE:
                return
            yield item

    def send(self, layer: int, slots: Sequence[SlotHandle], q, k, v, g, beta, *,
             model_id: Optional[str] = None, dtype=None) -> int:
        """Queues one update; returns its sequence number."""
        mid = model_id or self._model_id
        if not mid:
            raise ValueError("model_id: not given to update_stream() nor send()")
        with self._lock:
            if self._closed:
                raise StateCacheError("stream closed", "UpdateStream")
            seq = self._next_seq
            self._next_seq += 1
        req = self._client.update_request(mid, layer, slots, q, k, v, g, beta, dtype=dtype,
                                          sequence=seq)
        self._in_flight.acquire()
        self._requests.put(req)
        return seq

    def recv(self, timeout: Optional[float] = None) -> UpdateResult:
        """The next response in order. Raises its StateCacheError when that
        request failed (the stream stays open)."""
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
        if r.HasField("error") and r.error.code != 0:
            raise error_from_code(r.error.code, r.error.message,
                                  f"UpdateStream[seq={r.sequence}]")
        return UpdateResult(to_numpy(r.o), r.kernel_micros, r.sequence)

    def update(self, layer: int, slots: Sequence[SlotHandle], q, k, v, g, beta, **kw):
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

    def __exit__(self, *exc) -> None:
        self.close()
