"""grpc.aio channels to the runtime's unix socket, and error mapping for calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import grpc

from aggapi.runtime.errors import RuntimeUnavailable, from_rpc_error

T = TypeVar("T")

# Kubelet allows 16 MiB responses from CRI; ListImages/ListContainers on a busy
# node exceed grpc's 4 MiB default.
MAX_MESSAGE = 16 * 1024 * 1024


def unix_target(address: str) -> str:
    """Accept ``/path``, ``unix:/path`` or ``unix:///path``; return a grpc target."""
    if address.startswith("unix://"):
        return address
    if address.startswith("unix:"):
        return "unix://" + address[len("unix:"):]
    return "unix://" + address


def open_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        unix_target(address),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            # The peer is local: fail fast when the socket is gone instead of backing off.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ],
    )


class ChannelClient:
    """Owns one channel to a runtime socket; closing it (or leaving ``async with``)
    closes the channel. The CRI and containerd clients build their stubs on it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = open_channel(address)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def call(method: str, fn: Callable[..., Awaitable[T]], request: Any, *,
               deadline: float | None, metadata: tuple[tuple[str, str], ...] = ()) -> T:
    """One unary call with a ``deadline`` in seconds (None: none).

    grpc errors become aggapi.runtime.errors exceptions.
    """
    try:
        return await fn(request, timeout=deadline, metadata=metadata or None)
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err, method) from err
    except OSError as err:  # e.g. the socket path vanished between calls
        raise RuntimeUnavailable(grpc.StatusCode.UNAVAILABLE, str(err), method) from err
