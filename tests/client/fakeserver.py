"""An in-process HTTPS stand-in for kube-apiserver + aggapi, speaking the documented
wire format of pods/imagepullprogress and pods/copy on the /watch/ paths.

A fake for fast client and plugin tests; the real stack is exercised by tests/e2e.
Auth: a client certificate of its client CA, or a bearer token it knows; user
"mallory" is authenticated but forbidden everything.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import ssl
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from aggapi import wire
from aggapi.status import StatusError, status_middleware
from aggapi.tar.entrydigest import ANNOUNCEMENT, TRAILING_ANNOUNCEMENT, previous, record
from aggapi.tar.stream import DIR, PAX, REG, SYM, TarReader, header, pad, pax_header
from aggapi.tls import pki
from tests.tarcraft import headers_digest

PREFIX = "/apis/subresources.aggapi.io/v1alpha1/watch/namespaces/{ns}/pods/{pod}"
FORBIDDEN_USER = "mallory"


@dataclass
class Session:
    """One scripted progress connection: objects, then ``cut``, ``clean`` end or ``hold``."""

    objects: list[dict[str, Any]]
    end: str = "clean"
    delay: float = 0.0


@dataclass
class Pod:
    containers: dict[str, Path]
    cwd: str = "/"  # the containers' working directory: relative copy paths start there
    annotations: dict[str, str] = field(default_factory=dict)

    def manifest(self, ns: str, name: str) -> dict[str, Any]:
        """The core v1 Pod object (GET /api/v1/.../pods/NAME) for completion and
        container defaulting."""
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "annotations": self.annotations},
                "spec": {"containers": [{"name": c} for c in self.containers]}}


@dataclass
class FakeCluster:
    tmp: Path
    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    sessions: list[Session] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    cut_download_after: int | None = None  # the next file GET is cut after N bytes
    cut_upload_after: int | None = None  # the next upload is cut after N body bytes
    download_delay: float = 0.0  # per 64 KiB chunk, to let a test interrupt a transfer
    corrupt_sha: bool = False
    # As agents before sha256=trailer: any sha256 but 64 hex digits is refused.
    no_sha256_trailer: bool = False
    # As agents before the headers digest (sha256=headers...): refused as above.
    no_headers_digest: bool = False
    # As agents before digest=trailer: a file's sha256 always goes up front.
    no_download_trailer: bool = False
    # A digest=trailer reply framed badly: "short" (Content-Length below the trailer's
    # 32 bytes), "extra" (5 bytes more than the file and trailer), "cut" (the body ends
    # inside the trailer).
    trailer_framing: str = ""
    # Flip this byte of a digest=trailer body (an offset into it, data then trailer).
    flip_byte: int | None = None
    # As 622964a's agent: a symlink download is answered with the link whatever the query.
    symlinks_regardless: bool = False
    dir_tar: bytes | None = None  # served instead of a real directory tar
    dir_stall_after: int | None = None  # a directory GET stops after N bytes, forever
    workloads: dict[str, list[str]] = field(default_factory=dict)  # "deployments": names
    port: int = 0

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.ca = pki.new_ca("fake-cluster-ca")
        self.serving = pki.issue(self.ca, "fake-apiserver", server=True, ips=["127.0.0.1"])
        self.ca_file = self.tmp / "ca.crt"
        pki.write_file(self.ca_file, self.ca.cert_pem)
        self._runner: web.AppRunner | None = None

    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> str:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert, key = self.tmp / "srv.crt", self.tmp / "srv.key"
        self.serving.write(cert, key)
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(cafile=str(self.ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        app = web.Application(middlewares=[status_middleware, self._auth],
                              client_max_size=1 << 30)
        base = PREFIX
        app.router.add_get(base + "/imagepullprogress", self.progress)
        app.router.add_route("*", base + "/copy", self.copy)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}", self.get_pod)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/{kind}", self.list_workloads)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # --- kubeconfigs ------------------------------------------------------------------
    def kubeconfig(self, user: str = "alice", auth: str = "cert", *, namespace: str = "",
                   exec_tokens: list[str] | None = None) -> Path:
        """A kubeconfig for ``user``: ``cert``, ``token`` or ``exec`` (a script printing
        an ExecCredential; with ``exec_tokens`` it hands them out one per run)."""
        u: dict[str, Any] = {}
        d = self.tmp / f"kc-{user}-{auth}"
        d.mkdir(exist_ok=True)
        if auth == "cert":
            kp = pki.issue(self.ca, user, client=True)
            kp.write(d / "u.crt", d / "u.key")
            u = {"client-certificate": str(d / "u.crt"), "client-key": str(d / "u.key")}
        elif auth == "token":
            tok = f"tok-{user}"
            self.tokens[tok] = user
            u = {"token": tok}
        elif auth == "exec":
            toks = exec_tokens or [f"tok-{user}"]
            for t in toks:
                self.tokens.setdefault(t, user)
            (d / "tokens").write_text("\n".join(toks))
            (d / "runs").write_text("")
            script = d / "cred.py"
            script.write_text(
                "import json, pathlib, sys\n"
                f"d = pathlib.Path({str(d)!r})\n"
                "runs = d.joinpath('runs').read_text().count('x')\n"
                "d.joinpath('runs').write_text('x' * (runs + 1))\n"
                "toks = d.joinpath('tokens').read_text().split()\n"
                "tok = toks[min(runs, len(toks) - 1)]\n"
                "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
                " 'kind': 'ExecCredential', 'status': {'token': tok}}))\n")
            u = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                          "command": sys.executable, "args": [str(script)],
                          "interactiveMode": "Never"}}
        ctx: dict[str, Any] = {"cluster": "fake", "user": user}
        if namespace:
            ctx["namespace"] = namespace
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
               "clusters": [{"name": "fake", "cluster": {
                   "server": self.url, "certificate-authority": str(self.ca_file)}}],
               "users": [{"name": user, "user": u}],
               "contexts": [{"name": "fake", "context": ctx}]}
        path = d / "kubeconfig"
        path.write_text(json.dumps(doc))
        return path

    def exec_runs(self, user: str = "alice") -> int:
        return (self.tmp / f"kc-{user}-exec" / "runs").read_text().count("x")

    # --- middleware -------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        user = None
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if peer:
            for rdn in peer.get("subject", ()):
                for k, v in rdn:
                    if k == "commonName":
                        user = v
        authz = request.headers.get("Authorization", "")
        if user is None and authz.startswith("Bearer "):
            user = self.tokens.get(authz[7:])
        self.requests.append({"method": request.method, "path": request.path,
                              "query": list(request.query.items()), "user": user,
                              "headers": dict(request.headers),
                              "header_items": list(request.headers.items())})
        if user is None:
            raise StatusError(401, "Unauthorized")
        ns, pod = request.match_info.get("ns", ""), request.match_info.get("pod", "")
        sub = request.path.rsplit("/", 1)[-1]
        if user == FORBIDDEN_USER:
            raise StatusError(403, f'pods "{pod}" is forbidden: User "{user}" cannot watch '
                                   f'resource "pods/{sub}" in API group '
                                   f'"subresources.aggapi.io" in the namespace "{ns}"')
        if pod and (ns, pod) not in self.pods:
            raise StatusError(404, f'pods "{pod}" not found')
        return await handler(request)

    # --- core API (what completion and container defaulting read) ---------------------
    async def list_pods(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": [
            p.manifest(n, name) for (n, name), p in sorted(self.pods.items()) if n == ns]})

    async def get_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["pod"]
        return web.json_response(self.pods[(ns, name)].manifest(ns, name))

    async def list_workloads(self, request: web.Request) -> web.Response:
        names = self.workloads.get(request.match_info["kind"], [])
        return web.json_response({"kind": "List", "apiVersion": "v1", "items": [
            {"metadata": {"name": n, "namespace": request.match_info["ns"]}} for n in names]})

    # --- imagepullprogress ------------------------------------------------------------
    async def progress(self, request: web.Request) -> web.StreamResponse:
        pod = self.pods[(request.match_info["ns"], request.match_info["pod"])]
        for c in request.query.getall("container", []):
            if c not in pod.containers:
                raise StatusError(400, f'container "{c}" is not in pod '
                                       f'"{request.match_info["pod"]}"')
        if not self.sessions:
            raise StatusError(503, "no scripted session left", retry_after=0)
        s = self.sessions.pop(0) if len(self.sessions) > 1 else self.sessions[0]
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for obj in s.objects:
            await resp.write(json.dumps(obj).encode() + b"\n")
            if s.delay:
                await asyncio.sleep(s.delay)
        if s.end == "cut":
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("cut by the test")
        if s.end == "hold":
            await asyncio.sleep(3600)
        with contextlib.suppress(ConnectionResetError):  # the client may leave at Summary
            await resp.write_eof()
        return resp

    # --- copy -------------------------------------------------------------------------
    def _root(self, request: web.Request) -> tuple[Path, str]:
        pod = self.pods[(request.match_info["ns"], request.match_info["pod"])]
        c = request.query.get("container") or (next(iter(pod.containers))
                                                if len(pod.containers) == 1 else "")
        if not c:
            raise StatusError(400, "container is required")
        if c not in pod.containers:
            raise StatusError(404, f'container "{c}" not found in pod '
                                   f'"{request.match_info["pod"]}"')
        path = request.query.get("path", "")
        if not path or "\0" in path:
            raise StatusError(400, f"bad path: {path!r}")
        if not path.startswith("/"):  # as the agent: against the cwd, '..' stops at /
            path = os.path.normpath("/" + os.path.join(pod.cwd, path).lstrip("/"))
            path = "/" + path.lstrip("/")
        elif ".." in path.split("/"):
            raise StatusError(400, f"path must not contain '..': {path!r}")
        return pod.containers[c], path

    @staticmethod
    def _stat(p: Path, path: str) -> tuple[os.stat_result, dict[str, str]]:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            raise StatusError(404, f'path "{path}" not found in the container') from None
        kind = ("dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode)
                else "file")
        doc = {"name": p.name, "size": st.st_size, "mode": st.st_mode,
               "mtime": int(st.st_mtime), "uid": st.st_uid, "gid": st.st_gid,
               "linkTarget": os.readlink(p) if kind == "symlink" else "", "type": kind}
        return st, {"X-Aggapi-Stat": base64.b64encode(json.dumps(doc).encode()).decode()}

    async def copy(self, request: web.Request) -> web.StreamResponse:
        root, path = self._root(request)
        target = root / path.lstrip("/")
        if request.method == "POST":
            return await self._upload(request, target, path)
        st, hdrs = self._stat(target, path)
        if request.method == "HEAD":
            return web.Response(headers=hdrs)
        if request.method != "GET":
            raise StatusError(405, "method not allowed")
        if stat.S_ISDIR(st.st_mode):
            trailing = (request.query.get(wire.PARAM_DIGEST) == wire.DIGEST_TRAILER
                        and not self.no_download_trailer)
            body = self.dir_tar if self.dir_tar is not None else tar_of(target,
                                                                        trailing=trailing)
            if self.dir_stall_after is not None:
                resp = web.StreamResponse(headers={**hdrs, "Content-Type": "application/x-tar"})
                await resp.prepare(request)
                await resp.write(body[:self.dir_stall_after])
                # Until the client goes (polled: aiohttp has no event for it).
                while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
                return resp
            return web.Response(body=body, headers={**hdrs, "Content-Type": "application/x-tar"})
        if stat.S_ISLNK(st.st_mode):
            if request.query.get("symlink") != "keep" and not self.symlinks_regardless:
                raise StatusError(409, f"{path}: is a symbolic link; not followed")
            return web.Response(headers=hdrs)
        data = target.read_bytes()
        sha = hashlib.sha256(b"corrupt" if self.corrupt_sha else data).hexdigest()
        etag = f'"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"'
        start, code = 0, 200
        rng = request.headers.get("Range", "")
        if rng.startswith("bytes=") and request.headers.get("If-Range", etag) == etag:
            start = int(rng[6:].split("-")[0])
            if start >= len(data):
                raise StatusError(416, "range not satisfiable")
            code = 206
        trailer = (request.query.get(wire.PARAM_DIGEST) == wire.DIGEST_TRAILER
                   and not self.no_download_trailer)
        headers = {**hdrs, "ETag": etag, "Accept-Ranges": "bytes",
                   "X-Aggapi-Sha256": wire.DIGEST_TRAILER if trailer else sha,
                   "Content-Type": "application/octet-stream"}
        if code == 206:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        resp = web.StreamResponse(status=code, headers=headers)
        size, cut_trailer = len(data), False
        if trailer:  # the agent's framing: data, then the whole file's raw sha256
            framed = bytearray(data + bytes.fromhex(sha))
            if self.flip_byte is not None:
                framed[start + self.flip_byte] ^= 1
            framing, self.trailer_framing = self.trailer_framing, ""
            if framing == "short":
                framed = framed[:start + 20]
            elif framing == "extra":
                framed += b"\0" * 5
            data = bytes(framed)
            cut_trailer = framing == "cut"
        resp.content_length = len(data) - start
        await resp.prepare(request)
        cut, self.cut_download_after = self.cut_download_after, None
        if cut_trailer:
            cut = size - start + 10
        off = start
        while off < len(data):
            if cut is not None and off - start >= cut:
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.abort()
                raise ConnectionResetError("cut by the test")
            n = 65536 if cut is None else min(65536, start + cut - off)
            await resp.write(data[off:off + n])
            off += n
            if self.download_delay:
                await asyncio.sleep(self.download_delay)
        await resp.write_eof()
        return resp

    async def _upload(self, request: web.Request, target: Path, path: str) -> web.Response:
        want = request.query.get("sha256")
        headers = want is not None and (want == wire.SHA256_HEADERS_TRAILER
                                        or want.startswith(wire.SHA256_HEADERS_PREFIX))
        # An agent before the trailer predates the headers digest too.
        if ((want == wire.SHA256_TRAILER and self.no_sha256_trailer)
                or (headers and (self.no_headers_digest or self.no_sha256_trailer))):
            raise StatusError(400, wire.SHA256_REFUSED)
        cut, self.cut_upload_after = self.cut_upload_after, None
        if cut is not None:
            taken = 0
            while taken < cut and (piece := await request.content.read(cut - taken)):
                taken += len(piece)
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("cut by the test")
        data = await request.read()
        if want in (wire.SHA256_TRAILER, wire.SHA256_HEADERS_TRAILER):
            data, want = data[:-wire.SHA256_TRAILER_SIZE], \
                data[-wire.SHA256_TRAILER_SIZE:].hex()
        elif want and headers:
            want = want.removeprefix(wire.SHA256_HEADERS_PREFIX)
        if request.query.get("format") == "tar":
            h = hashlib.sha256()
            stream = HashingStream(BytesStream(data), h)
            entries = await untar_into(TarReader(stream), target)
            while await stream.read(1 << 16):  # trailing zero blocks count, as in the agent
                pass
            got = headers_digest(data) if headers else h.hexdigest()
            if want and want != got:
                raise StatusError(400, f"sha256 mismatch: got {got}")
            return web.json_response({"path": path, "size": stream.size,
                                      "sha256": got, "entries": entries})
        sha = hashlib.sha256(data).hexdigest()
        if want and want != sha:
            raise StatusError(400, f"sha256 mismatch: got {sha}, expected {want}")
        if not target.parent.is_dir():
            raise StatusError(404, f'directory of "{path}" not found in the container')
        if request.query.get("overwrite") == "false" and target.exists():  # noqa: ASYNC240
            raise StatusError(409, f'"{path}" exists')
        tmp = target.with_name(target.name + ".up")
        tmp.write_bytes(data)
        if "mode" in request.query:
            os.chmod(tmp, int(request.query["mode"], 8))
        os.replace(tmp, target)
        return web.json_response({"path": path, "size": len(data), "sha256": sha})


class BytesStream:
    """A received body, read back as a stream."""

    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)

    async def readexactly(self, n: int) -> bytes:
        b = self.buf.read(n)
        if len(b) < n:
            raise asyncio.IncompleteReadError(b, n)
        return b

    async def read(self, n: int = -1) -> bytes:
        return self.buf.read(n)


class HashingStream:
    def __init__(self, inner: Any, h: Any) -> None:
        self.inner, self.h, self.size = inner, h, 0

    async def readexactly(self, n: int) -> bytes:
        b: bytes = await self.inner.readexactly(n)
        self.h.update(b)
        self.size += len(b)
        return b

    async def read(self, n: int = -1) -> bytes:
        b: bytes = await self.inner.read(n)
        self.h.update(b)
        self.size += len(b)
        return b


async def untar_into(reader: TarReader, dest: Path) -> int:
    dest.mkdir(exist_ok=True)  # noqa: ASYNC240 (a test fake on local tmp)
    n = 0
    while (e := await reader.next()) is not None:
        parts = [p for p in e.name.split("/") if p not in ("", ".")]
        if e.name.startswith("/") or ".." in parts:
            raise StatusError(400, f"bad tar entry {e.name!r}")
        if not parts:
            continue
        p = dest.joinpath(*parts)
        if e.typeflag == DIR:
            p.mkdir(exist_ok=True)
        elif e.typeflag == SYM:
            os.symlink(e.linkname, p)
        else:
            with open(p, "wb") as f:  # noqa: ASYNC230
                while chunk := await reader.read(1 << 20):
                    f.write(chunk)
            os.chmod(p, e.mode & 0o777)
        n += 1
    return n


def tar_of(d: Path, *, complete: bool = True, trailing: bool = False) -> bytes:
    """A directory as the agent sends it: the announcement of per-file digests, entries
    (each regular file with its AGGAPI.sha256, or with ``trailing`` the entry after it
    with AGGAPI.previousSha256), then the "./" record with AGGAPI.*."""
    out = bytearray(TRAILING_ANNOUNCEMENT if trailing else ANNOUNCEMENT)
    owed: str | None = None

    def hdr(name: str, kind: bytes, **kw: Any) -> bytes:
        nonlocal owed
        recs, owed = {**previous(owed), **kw.pop("records", {})}, None
        return header(name, kind, records=recs, **kw)

    for cur, dirs, files in os.walk(d):
        dirs.sort()
        rel = os.path.relpath(cur, d)
        pre = "" if rel == "." else rel + "/"
        if pre:
            out += hdr(pre, DIR, mode=0o755)
        for name in sorted(files) + sorted(x for x in dirs if os.path.islink(Path(cur, x))):
            p = Path(cur, name)
            if p.is_symlink():
                out += hdr(pre + name, SYM, linkname=os.readlink(p))
            else:
                data = p.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                out += hdr(pre + name, REG, size=len(data), mode=p.stat().st_mode,
                           records={} if trailing else record(sha))
                out += data + pad(len(data))
                owed = sha if trailing else None
    if complete:
        out += pax_header("./", {"AGGAPI.complete": "true", "AGGAPI.skipped": "[]",
                                 **previous(owed)}, typeflag=PAX)
        out += header("./", DIR, mode=0o755)
    out += b"\0" * 1024
    return bytes(out)
