"""Exceptions of the statecache client, one class per gRPC status code.

Every RPC error becomes a StateCacheError subclass chosen by the status code
(the server's contract, proto/statecache/v1/statecache.proto):

  InvalidArgument     bad shape / dtype / NaN / field (message names the field)
  NotFound            unknown model, handle or prefix key
  FailedPrecondition  stale handle (released slot), incompatible tags, model in use
  ResourceExhausted   pool full (after evicting what may be evicted)
  AlreadyExists       model id taken
  Unavailable         server down or unreachable (retryable); also a name
                      that does not resolve (ShardedClient.from_dns)

Arguments the client itself rejects (a float64 array, a list where a
SlotHandle goes, a negative count, ...) raise InvalidArgument too, before any
RPC, with `method` the client method and the message naming the argument.
InvalidArgument is also a ValueError, so `except ValueError` keeps working.

    try:
        c.allocate_slots("m", 10_000)
    except statecache.ResourceExhausted as e:
        print(e.code, e.message)
"""
from __future__ import annotations

from typing import Dict, Optional, Type, Union

import grpc


class StateCacheError(Exception):
    """An RPC failed. `code` is a grpc.StatusCode, `message` the server's text,
    `method` the RPC name."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, method: str = "",
                 code: Optional[grpc.StatusCode] = None):
        if code is not None:
            self.code = code
        self.message = message
        self.method = method
        prefix = f"{method}: " if method else ""
        super().__init__(f"{prefix}{self.code.name}: {message}")


class Cancelled(StateCacheError):
    code = grpc.StatusCode.CANCELLED


class InvalidArgument(StateCacheError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(StateCacheError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(StateCacheError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(StateCacheError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(StateCacheError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(StateCacheError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(StateCacheError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(StateCacheError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(StateCacheError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(StateCacheError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(StateCacheError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(StateCacheError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(StateCacheError):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(StateCacheError):
    code = grpc.StatusCode.UNAUTHENTICATED


ALL_ERRORS = (Cancelled, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
              PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
              Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)

_BY_CODE: Dict[grpc.StatusCode, Type[StateCacheError]] = {cls.code: cls for cls in ALL_ERRORS}
_BY_VALUE: Dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def error_from_code(code: Union[grpc.StatusCode, int], message: str, method: str = "") -> StateCacheError:
    """The exception for a grpc.StatusCode or its integer value (as carried by
    UpdateResponse.error.code). Unknown integers give StateCacheError(UNKNOWN)."""
    if isinstance(code, int):
        status = _BY_VALUE.get(code)
        if status is None:
            return StateCacheError(f"(code {code}) {message}", method, grpc.StatusCode.UNKNOWN)
        code = status
    cls = _BY_CODE.get(code)
    if cls is None:
        return StateCacheError(message, method, code)
    return cls(message, method)


def error_from_rpc(err: grpc.RpcError, method: str) -> StateCacheError:
    """Maps a grpc.RpcError (a grpc.Call) onto its StateCacheError."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return error_from_code(code, details or "", method)
