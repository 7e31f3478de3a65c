"""pods/copy on the fake cluster (tests.client.fakeserver): stat, download (ranges, the
digest trailer, faults), upload (files and tars)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import stat
from pathlib import Path

from aiohttp import web

from aggapi import wire
from aggapi.status import StatusError
from aggapi.tar.stream import TarReader
from tests.client.fakestate import FakeClusterState
from tests.client.faketar import BytesStream, HashingStream, tar_of, untar_into
from tests.tarcraft import headers_digest


class FakeCopy(FakeClusterState):
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
            # Chunked, as kube-apiserver relays a tar (it has no length), 32 KiB a chunk.
            resp = web.StreamResponse(headers={**hdrs, "Content-Type": "application/x-tar"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for at in range(0, len(body), 32 << 10):
                await resp.write(body[at:at + (32 << 10)])
            await resp.write_eof()
            return resp
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

