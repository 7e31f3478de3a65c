"""pods/copy through the real aggregator and real kubectl.

Uploads: ``kubectl create --raw PATH -f FILE`` (a POST whose body kubectl streams with no
Content-Type); downloads: ``kubectl get --raw PATH`` (raw bytes on stdout). The target is
a container the kubelet stand-in runs through CRI (tests.framework.standin).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.copy.test_plain_tar import nobody_dir  # noqa: F401  (fixture)
from tests.framework.controlplane import ControlPlane
from tests.framework.node import Node
from tests.framework.procs import Proc
from tests.framework.standin import StandinKubelet, SyncStandin

from .conftest import GROUP_VERSION, E2EPod, delete_pod, kubectl, run_pod

MiB = 1 << 20


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_upload_then_download_with_matching_sha256(
        control_plane: ControlPlane, workload_pod: E2EPod, tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 123)
    src = tmp_path / "blob.bin"
    src.write_bytes(data)
    digest = sha256(data)
    q = {"container": workload_pod.container, "path": "/tmp/e2e-blob.bin"}
    r = await kubectl(control_plane, "create", "--raw",
                      workload_pod.path("copy", q, sha256=digest, mode="0640"),
                      "-f", str(src))
    assert r.rc == 0, r.err
    reply = json.loads(r.out)
    assert reply == {"path": "/tmp/e2e-blob.bin", "size": len(data), "sha256": digest}
    r = await kubectl(control_plane, "get", "--raw", workload_pod.path("copy", q))
    assert r.rc == 0, r.err
    assert len(r.out) == len(data) and sha256(r.out) == digest


async def test_head_carries_the_digests_get_carries(
        control_plane: ControlPlane, workload_pod: E2EPod, tmp_path: Path) -> None:
    """Through kube-apiserver's aggregation proxy, HEAD on pods/copy relays the same
    X-Aggapi-Sha256, Digest and Repr-Digest as GET: a client can verify before fetching."""
    from aggapi import wire
    from aggapi.client.connection import Connection

    data = os.urandom(MiB + 7)
    src = tmp_path / "head.bin"
    src.write_bytes(data)
    q = {"container": workload_pod.container, "path": "/tmp/e2e-head.bin"}
    r = await kubectl(control_plane, "create", "--raw", workload_pod.path("copy", q),
                      "-f", str(src))
    assert r.rc == 0, r.err
    names = (wire.HEADER_SHA256, wire.HEADER_DIGEST, wire.HEADER_REPR_DIGEST)
    got: dict[str, dict[str, str | None]] = {}
    async with await Connection.from_kubeconfig(str(control_plane.admin_kubeconfig)) as c:
        for method in ("HEAD", "GET"):
            async with c.request(method, workload_pod.path("copy", q)) as resp:
                assert resp.status == 200, method
                got[method] = {h: resp.headers.get(h) for h in names}
                if method == "GET":
                    assert await resp.read() == data
    assert got["HEAD"] == got["GET"], got
    assert got["GET"][wire.HEADER_SHA256] == sha256(data)


async def test_a_trailer_download_comes_through_the_aggregator_framed_and_verified(
        control_plane: ControlPlane, workload_pod: E2EPod, tmp_path: Path) -> None:
    """digest=trailer through kube-apiserver's aggregation proxy and the aggapi relay:
    the whole file's raw sha256 after the data, in Content-Length (no HTTP trailer to
    lose), also on a resumed 206; ncp's download verifies it."""
    from aggapi import wire
    from aggapi.client.connection import Connection
    from aggapi.client.copy import RemotePath, download

    data = os.urandom(3 * MiB + 11)
    src = tmp_path / "trailer.bin"
    src.write_bytes(data)
    q = {"container": workload_pod.container, "path": "/tmp/e2e-trailer.bin"}
    r = await kubectl(control_plane, "create", "--raw", workload_pod.path("copy", q),
                      "-f", str(src))
    assert r.rc == 0, r.err
    tq = {**q, wire.PARAM_DIGEST: wire.DIGEST_TRAILER}
    async with await Connection.from_kubeconfig(str(control_plane.admin_kubeconfig)) as c:
        for at in (0, MiB + 5):
            async with c.request("GET", workload_pod.path("copy", tq),
                                 headers={"Range": f"bytes={at}-"} if at else {}) as resp:
                assert resp.status == (206 if at else 200)
                assert resp.headers[wire.HEADER_SHA256] == wire.DIGEST_TRAILER
                assert int(resp.headers["Content-Length"]) == len(data) - at + 32
                assert await resp.read() == data[at:] + hashlib.sha256(data).digest()
        res = await download(c, RemotePath(workload_pod.namespace, workload_pod.name,
                                           "/tmp/e2e-trailer.bin", workload_pod.container),
                             tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == data and res.sha256 == sha256(data)


async def test_wrong_sha256_is_refused_and_target_kept(
        control_plane: ControlPlane, workload_pod: E2EPod, tmp_path: Path) -> None:
    q = {"container": workload_pod.container, "path": "/tmp/e2e-keep"}
    (tmp_path / "a").write_bytes(b"original")
    (tmp_path / "b").write_bytes(b"replacement")
    r = await kubectl(control_plane, "create", "--raw", workload_pod.path("copy", q),
                      "-f", str(tmp_path / "a"))
    assert r.rc == 0, r.err
    r = await kubectl(control_plane, "create", "--raw",
                      workload_pod.path("copy", q, sha256="0" * 64), "-f", str(tmp_path / "b"))
    # 422 Invalid: kubectl prints the Status message as "The request is invalid: ...".
    assert r.rc == 1 and "sha256 mismatch" in r.err and "target unchanged" in r.err, r.err
    r = await kubectl(control_plane, "get", "--raw", workload_pod.path("copy", q))
    assert r.out == b"original"


@pytest.fixture(scope="module")
def noshell_pod(standin: SyncStandin, node: Node, node_agent: Proc) -> Iterator[E2EPod]:
    pod = run_pod(standin, "noshell", node.images.noshell, command=("/sleep", "3600"))
    yield pod
    delete_pod(standin, pod.pod)


async def test_copy_into_a_container_without_shell_or_tar(
        control_plane: ControlPlane, noshell_pod: E2EPod, tmp_path: Path) -> None:
    """What kubectl cp cannot do: the image has no /bin/sh and no tar."""
    src = tmp_path / "config.json"
    src.write_bytes(b'{"ok": true}\n')
    q = {"container": "app", "path": "/config.json"}
    r = await kubectl(control_plane, "create", "--raw", noshell_pod.path("copy", q),
                      "-f", str(src))
    assert r.rc == 0, r.err
    r = await kubectl(control_plane, "get", "--raw", noshell_pod.path("copy", q))
    assert r.rc == 0 and r.out == src.read_bytes(), r.err


async def test_errors(control_plane: ControlPlane, workload_pod: E2EPod,
                      tmp_path: Path) -> None:
    """404 pod / file, 400 bad parameters, relayed by kube-apiserver to kubectl."""
    ghost = f"{GROUP_VERSION}/namespaces/default/pods/ghost/copy?container=app&path=/etc/passwd"
    r = await kubectl(control_plane, "get", "--raw", ghost)
    assert r.rc == 1 and "Error from server (NotFound)" in r.err, r.err
    assert 'pods "ghost" not found' in r.err
    c = workload_pod.container
    cases = [({"container": c, "path": "/no/such/file"}, "NotFound", "/no/such/file"),
             # Relative paths start at the container's working directory (here "/").
             ({"container": c, "path": "relative/path"}, "NotFound", "/relative/path"),
             ({"container": c, "path": "/etc%00x"}, "BadRequest", "NUL"),
             ({"container": "nope", "path": "/etc/passwd"}, "BadRequest", "nope"),
             ({"container": c}, "BadRequest", "path")]
    for query, reason, needle in cases:
        r = await kubectl(control_plane, "get", "--raw", workload_pod.path("copy", query))
        assert r.rc == 1 and f"Error from server ({reason})" in r.err, (query, r.err)
        assert needle in r.err, (query, r.err)
    src = tmp_path / "x"
    src.write_bytes(b"x")
    r = await kubectl(control_plane, "create", "--raw",
                      workload_pod.path("copy", container=c, path="/tmp/x", mode="9z"),
                      "-f", str(src))
    assert r.rc == 1 and "Error from server (BadRequest)" in r.err, r.err


async def test_stopped_container_is_409(control_plane: ControlPlane, node: Node,
                                        node_agent: Proc, standin: SyncStandin,
                                        tmp_path: Path) -> None:
    pod = await asyncio.to_thread(run_pod, standin, "stopped", node.images.busybox)
    try:
        async def stop(k: StandinKubelet) -> None:
            await k.stop_container(pod.pod, "app")

        await asyncio.to_thread(standin.call, stop)
        r = await kubectl(control_plane, "get", "--raw",
                          pod.path("copy", container="app", path="/etc/passwd"))
        assert r.rc == 1 and "Error from server (Conflict)" in r.err, r.err
        src = tmp_path / "x"
        src.write_bytes(b"x")
        r = await kubectl(control_plane, "create", "--raw",
                          pod.path("copy", container="app", path="/tmp/x"), "-f", str(src))
        assert r.rc == 1 and "Error from server (Conflict)" in r.err, r.err
    finally:
        await asyncio.to_thread(delete_pod, standin, pod.pod)


async def test_strict_parameters_and_a_plain_directory_tar_through_kubectl(
        control_plane: ControlPlane, workload_pod: E2EPod, tmp_path: Path,
        nobody_dir: Path) -> None:  # noqa: F811
    """Issue 35 through kube-apiserver and real kubectl: the timeout= kubectl adds for
    --request-timeout passes; a misspelled overwite=false is a 400 naming it and the
    target is kept; ``get --raw`` of a directory piped to GNU tar as nobody extracts
    silently and leaves the directory extracted into as it was."""
    import io
    import tarfile

    from tests.agent.copy.test_plain_tar import TOOLS, check_extraction

    c = workload_pod.container
    q = {"container": c, "path": "/tmp/e2e-strict"}
    (tmp_path / "a").write_bytes(b"original")
    (tmp_path / "b").write_bytes(b"replacement")
    r = await kubectl(control_plane, "create", "--raw", workload_pod.path("copy", q),
                      "-f", str(tmp_path / "a"), "--request-timeout=60s")
    assert r.rc == 0, r.err
    r = await kubectl(control_plane, "create", "--raw",
                      workload_pod.path("copy", q, overwite="false"), "-f", str(tmp_path / "b"))
    assert r.rc == 1 and "Error from server (BadRequest)" in r.err, r.err
    assert "'overwite'" in r.err, r.err
    r = await kubectl(control_plane, "get", "--raw", workload_pod.path("copy", q))
    assert r.out == b"original"

    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(MiB + 5)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (tmp_path / "tree.tar").write_bytes(buf.getvalue())
    d = {"container": c, "path": "/tmp/e2e-plain-dir"}
    r = await kubectl(control_plane, "create", "--raw",
                      workload_pod.path("copy", d, format="tar"), "-f", str(tmp_path / "tree.tar"))
    assert r.rc == 0, r.err
    r = await kubectl(control_plane, "get", "--raw", workload_pod.path("copy", d),
                      "--request-timeout=60s")
    assert r.rc == 0, r.err
    await asyncio.to_thread(check_extraction, TOOLS["gnu-tar"], r.out, nobody_dir, files)
