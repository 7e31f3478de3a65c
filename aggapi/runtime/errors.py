"""Exceptions raised by the runtime clients instead of raw grpc errors."""

from __future__ import annotations

import grpc


class RuntimeAccessError(Exception):
    """Base class of every runtime-access error."""


class RuntimeCallError(RuntimeAccessError):
    """A CRI/containerd call failed with a gRPC status other than the mapped ones."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "") -> None:
        super().__init__(f"{method or 'runtime call'}: {code.name}: {details}")
        self.code = code
        self.details = details
        self.method = method


class RuntimeUnavailable(RuntimeCallError):
    """The runtime socket is missing or the runtime is not answering (UNAVAILABLE,
    or DEADLINE_EXCEEDED while connecting). Callers may retry later."""


class RuntimeNotFound(RuntimeCallError):
    """NOT_FOUND from a call whose contract has no ``None`` result (e.g. read_content)."""


def from_rpc_error(err: grpc.aio.AioRpcError, method: str) -> RuntimeCallError:
    code = err.code()
    details = err.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return RuntimeUnavailable(code, details, method)
    if code == grpc.StatusCode.NOT_FOUND:
        return RuntimeNotFound(code, details, method)
    return RuntimeCallError(code, details, method)
