"""kubectl ncp through real kubectl against the fake cluster."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.client.fakeserver import FakeCluster
from tests.client.test_copy import HOSTILE, tree
from tests.plugins.helpers import KUBECTL, kubectl, kubectl_pty, plugin_env, screen_text

DATA = os.urandom(3 << 20)


def root(cluster: FakeCluster, c: str = "app") -> Path:
    return cluster.pods[("default", "web")].containers[c]


@pytest.fixture
def env(cluster: FakeCluster, plugin_bin: Path) -> dict[str, str]:
    return plugin_env(plugin_bin, cluster.kubeconfig())


async def test_file_both_ways(cluster: FakeCluster, env: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "up.bin"
    src.write_bytes(DATA)
    src.chmod(0o750)
    r = await kubectl(env, "ncp", "-c", "app", str(src), "web:/data/")
    assert r.rc == 0, r.err
    assert (root(cluster) / "data/up.bin").read_bytes() == DATA  # into the existing dir
    assert (root(cluster) / "data/up.bin").stat().st_mode & 0o777 == 0o750
    r = await kubectl(env, "ncp", "-c", "app", "default/web:/data/up.bin", str(tmp_path / "dn"))
    assert r.rc == 0, r.err
    assert (tmp_path / "dn").read_bytes() == DATA
    assert hashlib.sha256(DATA).hexdigest()[:16] in r.err


async def test_directory_both_ways(cluster: FakeCluster, env: dict[str, str],
                                   tmp_path: Path) -> None:
    src = tmp_path / "site"
    (src / "css/deep").mkdir(parents=True)
    (src / "index.html").write_text("<h1>hi</h1>")
    (src / "css/deep/x.css").write_bytes(DATA[:100_000])
    os.symlink("index.html", src / "home.html")
    r = await kubectl(env, "ncp", "-c", "app", str(src), "web:/data/site")
    assert r.rc == 0, r.err
    assert tree(root(cluster) / "data/site") == tree(src)
    out = tmp_path / "back"
    out.mkdir()
    r = await kubectl(env, "ncp", "-c", "app", "web:/data/site", str(out))
    assert r.rc == 0, r.err
    assert tree(out / "site") == tree(src)  # cp -r: into the existing directory
    assert sorted(os.listdir(out)) == ["site"]


async def test_interrupted_download_resumes(cluster: FakeCluster, env: dict[str, str],
                                            tmp_path: Path) -> None:
    (root(cluster) / "data/big.bin").write_bytes(DATA)
    dest = tmp_path / "big.bin"
    partial = tmp_path / ".big.bin.ncp-partial"
    proc = await asyncio.create_subprocess_exec(  # 1 MiB/s: slow enough to interrupt
        KUBECTL, "ncp", "--limit-rate=1M", "-c", "app", "web:/data/big.bin", str(dest), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    for _ in range(200):
        await asyncio.sleep(0.05)
        if partial.exists() and partial.stat().st_size > 500_000:
            break
    proc.send_signal(signal.SIGKILL)  # kubectl exec'd the plugin: this is the plugin
    await proc.wait()
    assert not dest.exists()
    kept = partial.stat().st_size
    assert 0 < kept < len(DATA)
    r = await kubectl(env, "ncp", "-c", "app", "web:/data/big.bin", str(dest))
    assert r.rc == 0, r.err
    assert dest.read_bytes() == DATA
    assert f"resumed at {kept} bytes" in r.err
    assert not partial.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["-c", "app", "ghost:/data/x", "."], 'Error from server (NotFound): pods "ghost" not found'),
    (["-c", "zzz", "web:/data", "out"], 'container "zzz" not found in pod "web"'),
    (["-c", "app", "web:/nope/file", "out"], 'path "/nope/file" not found'),
    (["-c", "app", "{tmp}/up", "ghost:/data/x"], 'pods "ghost" not found'),
    (["web:/data/x", "out"],  # no -c: the first container, as kubectl cp picks it
     'Defaulted container "app" out of: app, side\nError from server (NotFound): '
     'path "/data/x" not found'),
])
async def test_failures_exit_non_zero_with_server_message(
        cluster: FakeCluster, env: dict[str, str], tmp_path: Path, args: list[str],
        message: str) -> None:
    (tmp_path / "up").write_text("x")
    args = [a.format(tmp=tmp_path) for a in args]
    r = await kubectl(env, "ncp", *args)
    assert r.rc == 1, r.err
    assert message in r.err
    assert not (Path.cwd() / "out").exists()


async def test_rbac_denial(cluster: FakeCluster, plugin_bin: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_bin, cluster.kubeconfig("mallory", "cert"))
    r = await kubectl(env, "ncp", "-c", "app", "web:/data", str(tmp_path / "x"))
    assert r.rc == 1
    assert 'Error from server (Forbidden): pods "web" is forbidden: User "mallory"' in r.err


async def test_corrupt_download_leaves_nothing(cluster: FakeCluster, env: dict[str, str],
                                               tmp_path: Path) -> None:
    (root(cluster) / "data/f").write_bytes(DATA[:1000])
    cluster.corrupt_sha = True
    (tmp_path / "dl").mkdir()
    r = await kubectl(env, "ncp", "-c", "app", "web:/data/f", str(tmp_path / "dl/f"))
    assert r.rc == 1 and "sha256 mismatch" in r.err
    assert os.listdir(tmp_path / "dl") == []


async def test_hostile_directory_is_refused(cluster: FakeCluster, env: dict[str, str],
                                            tmp_path: Path) -> None:
    cluster.dir_tar = HOSTILE["escaping-symlink"]
    (tmp_path / "dl").mkdir()
    r = await kubectl(env, "ncp", "-c", "app", "web:/data", str(tmp_path / "dl/d"))
    assert r.rc == 3, r.err
    assert "warning: refused symlink 'd/l' -> '../../x' points outside the destination" in r.err
    assert "error: 1 entries were refused" in r.err
    assert os.listdir(tmp_path / "dl") == ["d"] and os.listdir(tmp_path / "dl/d") == ["d"]
    assert os.listdir(tmp_path / "dl/d/d") == []


async def test_symlink_download_pointing_outside_fails(cluster: FakeCluster,
                                                      env: dict[str, str],
                                                      tmp_path: Path) -> None:
    os.symlink("/root/.kube/config", root(cluster) / "data/app.conf")
    (tmp_path / "dl").mkdir()
    r = await kubectl(env, "ncp", "-P", "-c", "app", "web:/data/app.conf",
                      str(tmp_path / "dl"))
    assert r.rc == 1 and "points outside" in r.err
    assert os.listdir(tmp_path / "dl") == []


async def test_symlinks_are_copied_only_when_asked(cluster: FakeCluster, env: dict[str, str],
                                                  tmp_path: Path) -> None:
    """Issue 24 finding 8, through kubectl: a download of a symlink needs -P, an upload of
    a local symlink needs -L (the link a download planted does not upload the user's key)."""
    os.symlink(".ssh/id_ed25519", root(cluster) / "data/app.conf")
    dl = tmp_path / "dl"
    dl.mkdir()
    r = await kubectl(env, "ncp", "-c", "app", "web:/data/app.conf", str(dl))
    assert r.rc == 1 and "symbolic link" in r.err and os.listdir(dl) == []
    r = await kubectl(env, "ncp", "-P", "-c", "app", "web:/data/app.conf", str(dl))
    assert r.rc == 0, r.err
    assert os.readlink(dl / "app.conf") == ".ssh/id_ed25519"
    (dl / ".ssh").mkdir()
    (dl / ".ssh/id_ed25519").write_bytes(b"PRIVATE KEY")
    os.unlink(root(cluster) / "data/app.conf")
    r = await kubectl(env, "ncp", "-c", "app", str(dl / "app.conf"), "web:/data/app.conf")
    assert r.rc == 1 and "symbolic link" in r.err and "-L" in r.err
    assert not (root(cluster) / "data/app.conf").exists()
    r = await kubectl(env, "ncp", "-L", "-c", "app", str(dl / "app.conf"),
                      "web:/data/app.conf")
    assert r.rc == 0, r.err
    assert (root(cluster) / "data/app.conf").read_bytes() == b"PRIVATE KEY"


async def test_usage_errors(env: dict[str, str], tmp_path: Path) -> None:
    r = await kubectl(env, "ncp", str(tmp_path), str(tmp_path / "b"))
    assert r.rc == 2 and "exactly one of SRC and DST" in r.err
    assert r.err.endswith("See 'kubectl ncp --help' for usage.\n"), r.err
    r = await kubectl(env, "ncp", "--retries=x", "web:/a", str(tmp_path))
    assert r.rc == 2 and r.err.startswith("error: argument --retries: invalid int"), r.err


async def test_progress_bar_on_a_terminal(cluster: FakeCluster, env: dict[str, str],
                                          tmp_path: Path) -> None:
    (root(cluster) / "data/big.bin").write_bytes(DATA)
    cluster.download_delay = 0.02
    r = await kubectl_pty(env, "ncp", "-c", "app", "web:/data/big.bin", str(tmp_path / "b"))
    assert r.rc == 0, r.out
    screen = screen_text(r.out)
    pcts = [int(p) for p in re.findall(r"(\d+)%", screen)]
    assert "━" in screen and len(set(pcts)) >= 3 and pcts == sorted(pcts)
    assert pcts[-1] == 100 and "/s" in screen


async def test_directory_upload_packs_before_the_first_request(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tree's listing and tar size start before any request, so they are made while
    the connection is made and the pod and the target are looked up."""
    from aggapi.client import copy
    from aggapi.plugins import ncp

    seen: list[int] = []
    real = copy.pack_dir

    async def pack_dir(*args: Any, **kwargs: Any) -> copy.PackedDir:
        seen.append(len(cluster.requests))
        return await real(*args, **kwargs)

    monkeypatch.setattr(copy, "pack_dir", pack_dir)
    src = tmp_path / "site"
    (src / "css").mkdir(parents=True)
    (src / "css/x.css").write_bytes(DATA[:5000])
    rc = await asyncio.to_thread(ncp.main, ["--kubeconfig", str(cluster.kubeconfig()), "-q",
                                            "-c", "app", str(src), "web:/data/site"])
    assert rc == 0
    assert seen == [0] and len(cluster.requests) >= 3  # pod, stat, upload
    assert tree(root(cluster) / "data/site") == tree(src)
