"""A copy request's query: its parameter names checked (every one known, each once),
and the options of one upload as the copy handlers parsed them from the request and
its capability (aggapi.agent.copy.handlers.upload_params)."""

from __future__ import annotations

from dataclasses import dataclass, field

from multidict import MultiMapping

from aggapi import wire
from aggapi.agent.copy.atomic import Owner
from aggapi.status import StatusError


def strict_query(method: str, query: MultiMapping[str]) -> None:
    """A 400 naming any parameter the copy does not take, or one given twice. The
    apiserver refuses them first and passes on only what it parsed; this holds for any
    other caller of the agent too (defence in depth)."""
    problem = wire.copy_query_problem(method, [k for k, _ in query.items()])
    if problem is not None:
        raise StatusError(400, problem)


@dataclass(frozen=True)
class UploadParams:
    overwrite: bool = True
    owner: Owner = field(default_factory=Owner)
    sha256: str | None = None
    # The expected sha256 comes as the body's last 32 bytes (wire.SHA256_TRAILER).
    sha256_trailer: bool = False
    # The sha256 (either way) is the tar's headers digest (aggapi.tar.entrydigest).
    sha256_headers: bool = False
    tar: bool = False
