"""pods/copy: download (GET), stat (HEAD) and upload (POST) through the node's agent.

Authorization: the request's own SubjectAccessReview has already run (verb from
the path: get, create, or watch under the /watch/ prefix). Here we also require
the verb of the operation itself (get to read, create to write), so a user who
may only watch cannot upload through the long-running path, and, unless
--copy-require-exec=false, ``create`` on core ``pods/exec`` for uploads: writing
into a container is as strong as running a command in it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from aggapi import GROUP
from aggapi.apiserver import appkeys
from aggapi.apiserver.authz import check
from aggapi.apiserver.handlers import agent_client
from aggapi.apiserver.pods import PodTarget, lookup
from aggapi.apiserver.requestinfo import RequestInfo
from aggapi.capability import ContainerRef
from aggapi.status import StatusError

# Parameters the agent acts on; the apiserver vouches for them inside the token.
UPLOAD_PARAMS = ("sha256", "mode", "uid", "gid", "overwrite", "format")
# Response headers of the agent a client needs (stat, digest, ranges).
RELAYED_HEADERS = ("Content-Length", "Content-Type", "Content-Range", "Accept-Ranges",
                   "ETag", "Last-Modified", "Digest", "Repr-Digest", "X-Aggapi-Stat",
                   "X-Aggapi-Sha256", "Retry-After")
CHUNK = 1 << 20


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


def _path(request: web.Request) -> str:
    path = request.query.get("path", "")
    if not path:
        raise StatusError(400, "query parameter 'path' is required")
    if "\x00" in path or not path.startswith("/"):
        raise StatusError(400, f"path must be absolute, got {path!r}")
    if len(path) > 4096:
        raise StatusError(400, "path too long")
    # Passed on as given: the agent resolves it inside the container's root (a lexical
    # normpath here would disagree with the container's own symlinks).
    return path


async def _authorize_operation(request: web.Request, info: RequestInfo, upload: bool) -> None:
    user = request[appkeys.USER]
    op_verb = "create" if upload else "get"
    if info.verb != op_verb:
        await check(request, user, RequestInfo(
            verb=op_verb, api_group=GROUP, api_version=info.api_version,
            namespace=info.namespace, resource="pods", subresource="copy", name=info.name,
            is_resource_request=True, path=info.path))
    if upload and request.app[appkeys.CONFIG].copy_require_exec:
        await check(request, user, RequestInfo(
            verb="create", api_group="", api_version="v1", namespace=info.namespace,
            resource="pods", subresource="exec", name=info.name,
            is_resource_request=True, path=info.path))


async def copy(request: web.Request) -> web.StreamResponse:
    info = request[appkeys.INFO]
    upload = request.method == "POST"
    if request.method not in ("GET", "HEAD", "POST"):
        raise StatusError(405, f"method {request.method} is not allowed on pods/copy",
                          headers={"Allow": "GET, HEAD, POST"})
    path = _path(request)
    await _authorize_operation(request, info, upload)

    target = await lookup(request.app[appkeys.KUBE_API], info.namespace, info.name)
    if not target.node:
        raise StatusError(409, f'pod "{target.name}" is not scheduled to a node yet')
    container = _container(target, request.query.get("container", ""))
    operation = "copy.upload" if upload else (
        "copy.stat" if request.method == "HEAD" else "copy.download")
    params = {k: request.query[k] for k in UPLOAD_PARAMS if k in request.query} if upload \
        else {}

    fwd = {h: request.headers[h] for h in ("Range", "If-Range") if h in request.headers}
    if upload and request.content_length is not None:
        fwd["Content-Length"] = str(request.content_length)
    if upload:
        fwd["Content-Type"] = "application/octet-stream"

    agent = agent_client(request)
    upstream = await agent.open(
        request.method, "/v1/copy", node=target.node, subject=request[appkeys.USER].name,
        operation=operation, pod_namespace=target.namespace, pod_name=target.name,
        pod_uid=target.uid, containers=(container,), copy_path=path, params=params,
        query={"container": container.name, "path": path, **params},
        headers=fwd, data=_body(request) if upload else None,
    )
    try:
        resp = web.StreamResponse(status=upstream.status)
        for h in RELAYED_HEADERS:
            if h in upstream.headers:
                resp.headers[h] = upstream.headers[h]
        if "Content-Length" not in upstream.headers:
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        if request.method != "HEAD":
            async for chunk, _ in upstream.content.iter_chunks():
                await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        # close, not release: if the client went away mid-transfer the agent must see
        # the connection end too, so it aborts (and removes its temp file).
        upstream.close()


async def _body(request: web.Request) -> AsyncIterator[bytes]:
    # Received pieces pass on as they are: iter_chunked would join them (a copy of
    # every byte on the event loop, which is also busy with TLS both ways).
    async for chunk, _ in request.content.iter_chunks():
        yield chunk
