"""kubectl image-pull-progress through real kubectl against the fake cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.client.fakeserver import FakeCluster, Session
from tests.plugins.helpers import kubectl, kubectl_pty, plugin_env, screen_text

IMG = "registry.local/app:1"
LAYERS = ("sha256:" + "a" * 64, "sha256:" + "b" * 64)
TOTAL = 4 << 20


def prog(layer: str, n: int, phase: str = "Downloading", **kw: Any) -> dict[str, Any]:
    return {"kind": "Progress", "image": IMG, "layer": layer, "progress": n, "total": TOTAL,
            "error": "", "container": "app", "phase": phase,
            "bytesPerSecond": 1048576.0 if phase == "Downloading" else None,
            "etaSeconds": (TOTAL - n) / 1048576 if phase == "Downloading" else None,
            "time": "2025-01-01T00:00:00.000Z", **kw}


def pull_script() -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [
        prog(LAYERS[0], 0, "Waiting", waiting={"inFlight": ["other:1"], "limit": 1}),
        prog(LAYERS[1], 0, "Waiting", waiting={"inFlight": ["other:1"], "limit": 1})]
    for step in range(1, 9):
        n = TOTAL * step // 8
        phase = "Downloading" if step < 8 else "Extracting"
        objs += [prog(LAYERS[0], n, phase), prog(LAYERS[1], n, phase)]
    objs += [prog(LAYERS[0], TOTAL, "Done"), prog(LAYERS[1], TOTAL, "Done"),
             {"kind": "Summary", "phase": "Done", "progress": 2 * TOTAL, "total": 2 * TOTAL,
              "images": [{"container": "app", "image": IMG, "phase": "Done"}],
              "time": "2025-01-01T00:00:01.000Z"}]
    return objs


FAILED = {"kind": "Error", "image": IMG, "container": "app", "phase": "Failed",
          "error": "ErrImagePull: manifest unknown", "time": "t"}


async def test_plain_lines_and_exit_0(cluster: FakeCluster, plugin_bin: Path) -> None:
    cluster.sessions = [Session(pull_script()[:6], end="cut"), Session(pull_script())]
    env = plugin_env(plugin_bin, cluster.kubeconfig())
    r = await kubectl(env, "image-pull-progress", "web", "-c", "app")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert any("Waiting for a pull slot (1/1 in use)" in ln for ln in lines)
    assert any("Extracting" in ln for ln in lines)
    assert lines[-1].startswith("summary  Done  app=Done")
    assert "reconnecting" in r.err  # the cut was resumed, not fatal


async def test_json_passes_objects_through(cluster: FakeCluster, plugin_bin: Path) -> None:
    cluster.sessions = [Session(pull_script())]
    env = plugin_env(plugin_bin, cluster.kubeconfig("alice", "exec"))
    r = await kubectl(env, "image-pull-progress", "web", "-o", "json", "--granularity",
                      "layer")
    assert r.rc == 0, r.err
    assert [json.loads(ln) for ln in r.out.splitlines()] == pull_script()
    assert ("granularity", "layer") in cluster.requests[-1]["query"]


async def test_pull_error_exits_non_zero(cluster: FakeCluster, plugin_bin: Path) -> None:
    cluster.sessions = [Session([*pull_script()[:4], FAILED])]
    r = await kubectl(plugin_env(plugin_bin, cluster.kubeconfig()), "image-pull-progress",
                      "web")
    assert r.rc == 1
    assert "ErrImagePull: manifest unknown" in r.err


async def test_refusals_exit_non_zero_with_server_message(cluster: FakeCluster,
                                                          plugin_bin: Path) -> None:
    cluster.sessions = [Session(pull_script())]
    r = await kubectl(plugin_env(plugin_bin, cluster.kubeconfig()), "image-pull-progress",
                      "ghost")
    assert r.rc == 1 and 'Error from server (NotFound): pods "ghost" not found' in r.err
    r = await kubectl(plugin_env(plugin_bin, cluster.kubeconfig()), "image-pull-progress",
                      "web", "-c", "db")
    assert r.rc == 1 and 'container "db" is not in pod "web"' in r.err
    r = await kubectl(plugin_env(plugin_bin, cluster.kubeconfig("mallory", "token")),
                      "image-pull-progress", "web")
    assert r.rc == 1 and "Error from server (Forbidden)" in r.err
    assert 'User "mallory" cannot watch resource "pods/imagepullprogress"' in r.err


async def test_terminal_rendering(cluster: FakeCluster, plugin_bin: Path) -> None:
    cluster.sessions = [Session(pull_script(), delay=0.12)]
    r = await kubectl_pty(plugin_env(plugin_bin, cluster.kubeconfig()), "image-pull-progress",
                          "web")
    assert r.rc == 0, r.out
    screen = screen_text(r.out)
    assert "━" in screen  # rich's bars were drawn
    totals = [int(m) for m in re.findall(r"total\s.*?(\d+)%", screen)]
    assert len(set(totals)) >= 4, totals  # redrawn as the pull advanced
    assert totals == sorted(totals)
    assert totals[-1] == 100
    assert "Waiting for a pull slot" in screen and "Extracting" in screen
    layer_rows = re.findall(r"app registry\.local/app:1 (a{12}|b{12})", screen)
    assert {"a" * 12, "b" * 12} <= set(layer_rows)


async def test_terminal_shows_errors(cluster: FakeCluster, plugin_bin: Path) -> None:
    cluster.sessions = [Session([*pull_script()[:4], FAILED], delay=0.05)]
    r = await kubectl_pty(plugin_env(plugin_bin, cluster.kubeconfig()), "image-pull-progress",
                          "web")
    assert r.rc == 1
    assert "\x1b[1;31merror: ErrImagePull" in r.out  # bold red
