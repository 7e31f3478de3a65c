"""pods/copy: download (GET), stat (HEAD) and upload (POST) through the node's agent.

Authorization is done before this handler runs, by the authz layer from what
the route table declares for pods/copy (the operation's own verb, and ``create``
on core ``pods/exec`` for every copy operation). The pod acted on is the one that was
authorized: its namespace and name come from the request's one parsed
``RequestInfo``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import ClientPayloadError, web

from aggapi.apiserver.agentclient import AgentClient, require_agent
from aggapi.apiserver.pods import PodTarget, lookup
from aggapi.apiserver.requestinfo import INFO
from aggapi.apiserver.user import USER
from aggapi.auth.capability import ContainerRef
from aggapi.kube.client import KubeClient
from aggapi.serve.bodyreceiver import ResponseBody
from aggapi.serve.drain import Drain
from aggapi.serve.unread import answer_unread
from aggapi.status import StatusError
from aggapi.wire import (
    AGENT_COPY_PATH,
    CLIENT_PARAMS,
    DOWNLOAD_CHOICES,
    FORWARDED_HEADERS,
    PARAM_CONTAINER,
    PARAM_PATH,
    RELAYED_HEADERS,
    UPLOAD_PARAMS,
    copy_operation,
    copy_query_problem,
)


def _container(target: PodTarget, name: str) -> ContainerRef:
    if name:
        return target.select([name])[0]
    runnable = [c for c in target.containers if c.kind == "regular"]
    default = (target.raw.get("metadata", {}).get("annotations") or {}).get(
        "kubectl.kubernetes.io/default-container")
    if default:
        return target.select([default])[0]
    if len(runnable) == 1:
        return runnable[0]
    raise StatusError(400, "a container name must be specified for pod "
                           f"{target.name}, choose one of: "
                           f"{', '.join(c.name for c in runnable)}")


def _strict_query(request: web.Request) -> None:
    """Every parameter known, each once (before the pod is looked up): the agent is
    told only the ones parsed here, so a misspelled one would otherwise be dropped
    silently (``overwite=false`` overwriting)."""
    problem = copy_query_problem(request.method, [k for k, _ in request.query.items()],
                                 also=CLIENT_PARAMS)
    if problem is not None:
        raise StatusError(400, problem)


def _path(request: web.Request) -> str:
    path = request.query.get(PARAM_PATH, "")
    if not path:
        raise StatusError(400, "query parameter 'path' is required")
    if "\x00" in path:
        raise StatusError(400, "path contains a NUL byte")
    if len(path) > 4096:
        raise StatusError(400, "path too long")
    # Passed on as given, also when relative (kubectl cp's "pod:dir/file"): the agent
    # resolves it inside the container's root, a relative one against the container's
    # working directory, which only the node knows. A lexical normpath here would
    # disagree with the container's own symlinks.
    return path


class CopyHandler:
    """Relays one copy between the client and the pod's node agent."""

    def __init__(self, kube_api: KubeClient, agent: AgentClient | None,
                 drain: Drain | None = None) -> None:
        self.kube_api = kube_api
        self.agent = agent
        # This replica's shutdown: copies that cannot finish before it stops end early
        # with a retryable 503 (aggapi/apiserver/shutdown.py).
        self.drain = drain

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        if self.drain is None:
            return await self.relay(request)
        return await self.drain.run(request, self.relay)

    async def relay(self, request: web.Request) -> web.StreamResponse:
        info = request[INFO]
        upload = request.method == "POST"  # the route table admits GET, HEAD and POST
        _strict_query(request)
        path = _path(request)
        target = await lookup(self.kube_api, info.namespace, info.name)
        if not target.node:
            raise StatusError(409, f'pod "{target.name}" is not scheduled to a node yet')
        container = _container(target, request.query.get(PARAM_CONTAINER, ""))
        params = {k: request.query[k] for k in UPLOAD_PARAMS if k in request.query} \
            if upload else {}
        # Not vouched for in the token: they only choose how a symlink is answered and
        # where a file's digest goes (before its data or after); HEAD answers as GET.
        extra = {k: request.query[k] for k in DOWNLOAD_CHOICES if k in request.query} \
            if not upload else {}

        fwd = {h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers}
        if upload and request.content_length is not None:
            fwd["Content-Length"] = str(request.content_length)
        if upload:
            fwd["Content-Type"] = "application/octet-stream"

        try:
            upstream = await require_agent(self.agent).open(
                request.method, AGENT_COPY_PATH, node=target.node,
                subject=request[USER].name, operation=copy_operation(request.method),
                pod_namespace=target.namespace, pod_name=target.name, pod_uid=target.uid,
                containers=(container,), copy_path=path, params=params,
                query={PARAM_CONTAINER: container.name, PARAM_PATH: path, **params,
                       **extra},
                headers=fwd, data=_body(request) if upload else None,
            )
        except StatusError as err:
            if upload and not request.content.is_eof():
                return await _answer_and_close(request, err)
            raise
        try:
            resp = web.StreamResponse(status=upstream.status)
            for h in RELAYED_HEADERS:
                if h in upstream.headers:
                    resp.headers[h] = upstream.headers[h]
            if "Content-Length" not in upstream.headers:
                resp.enable_chunked_encoding()
            await resp.prepare(request)
            if request.method != "HEAD":
                try:
                    # A file's body (it has a Content-Length) is decrypted straight
                    # into the relay's buffers and passed on as views of them.
                    body = ResponseBody(upstream)
                    while chunk := await body.next_piece():
                        await resp.write(chunk)
                except (OSError, ClientPayloadError) as exc:
                    # The head is out, so no Status can follow: the client must see the
                    # body cut (it then resumes from what came), not wait for the rest of
                    # its Content-Length forever.
                    if request.transport is not None:
                        request.transport.abort()
                    raise ConnectionResetError(f"copy body cut: {exc}") from None
            await resp.write_eof()
            return resp
        finally:
            # close, not release: if the client went away mid-transfer the agent must
            # see the connection end too, so it aborts (and removes its temp file).
            upstream.close()


# How long the connection of an upload whose agent failed stays open, not read, for
# its Status to reach the client: closing with unread data sends a reset, which would
# destroy the answer in flight.
CLOSE_GRACE = 1.0


async def _answer_and_close(request: web.Request, err: StatusError) -> web.StreamResponse:
    """The agent failed (died, refused) before the upload's body was all read: answer
    at once, read no more of the body, and close the connection."""
    return await answer_unread(request, err, CLOSE_GRACE)


async def _body(request: web.Request) -> AsyncIterator[bytes]:
    # Received pieces pass on as they are: iter_chunked would join them (a copy of
    # every byte on the event loop, which is also busy with TLS both ways).
    async for chunk, _ in request.content.iter_chunks():
        yield chunk
