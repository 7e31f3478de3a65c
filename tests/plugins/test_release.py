"""The plugin release from hack/build-plugins.sh: krew manifests that follow krew's rules
and carry each archive's real sha256, archives holding LICENSE and a zipapp with exactly
the plugins' dependencies for the right platform, and the linux-amd64 zipapp running on
an isolated interpreter that sees no site-packages."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.client.fakeserver import FakeCluster
from tests.framework.repo import REPO
from tests.plugins import release
from tests.plugins.helpers import KUBECTL, kubectl
from tests.plugins.krew_rules import validate

pytestmark = pytest.mark.slow

MODULES = {"ncp": "aggapi.plugins.ncp", "image-pull-progress": "aggapi.plugins.image_pull_progress"}
# Part of every compiled extension's file name for each target (CPython 3.11).
SO_TAG = {"linux/amd64": "cpython-311-x86_64-linux-gnu.so",
          "linux/arm64": "cpython-311-aarch64-linux-gnu.so",
          "darwin/amd64": "cpython-311-darwin.so", "darwin/arm64": "cpython-311-darwin.so"}
MACHO_CPU = {"darwin/amd64": b"\x07\x00\x00\x01", "darwin/arm64": b"\x0c\x00\x00\x01"}


@pytest.mark.parametrize("plugin", sorted(release.EXES))
def test_manifest_follows_krew_rules(plugin_release: Path, plugin: str) -> None:
    path = plugin_release / "krew" / f"{plugin}.yaml"
    doc = yaml.safe_load(path.read_text())

    def archive_for(uri: str) -> Path:
        assert uri.startswith(release.BASE_URL + "/"), uri
        return plugin_release / PurePosixPath(uri).name

    assert validate(doc, path.name, archive_for) == []
    assert doc["spec"]["version"] == release.VERSION
    got = {f"{p['selector']['matchLabels']['os']}/{p['selector']['matchLabels']['arch']}"
           for p in doc["spec"]["platforms"]}
    assert got == set(release.PLATFORMS)
    assert {p["bin"] for p in doc["spec"]["platforms"]} == {release.EXES[plugin]}
    # krew puts only ``bin`` on PATH; the completer is installed beside it.
    for p in doc["spec"]["platforms"]:
        assert {f["from"] for f in p["files"]} == {release.EXES[plugin],
                                                    release.COMPLETERS[plugin], "LICENSE"}
    # The committed file is the template: all but version and platforms carried over.
    template = yaml.safe_load((REPO / "plugins/krew" / f"{plugin}.yaml").read_text())
    for key in ("shortDescription", "homepage", "description", "caveats"):
        assert doc["spec"][key] == template["spec"][key]


def zipapp_names(archive: Path, exe: str) -> tuple[dict[str, object], list[str], bytes]:
    """The zipapp's shiv environment, its entry names and its first bytes."""
    with tarfile.open(archive) as tar:
        f = tar.extractfile(exe)
        assert f is not None
        data = f.read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        env = json.loads(z.read("environment.json"))
        return env, z.namelist(), data[:64]


@pytest.mark.parametrize("platform", release.PLATFORMS)
@pytest.mark.parametrize("plugin", sorted(release.EXES))
def test_archive_holds_license_and_a_zipapp_for_its_platform(plugin_release: Path,
                                                             plugin: str,
                                                             platform: str) -> None:
    archive = release.archive(plugin_release, plugin, platform)
    exe = release.EXES[plugin]
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        completer = release.COMPLETERS[plugin]
        assert set(members) == {exe, completer, "LICENSE"}
        assert members[exe].mode == 0o755 and members["LICENSE"].mode == 0o644
        assert members[completer].mode == 0o755
        lic = tar.extractfile("LICENSE")
        assert lic is not None and lic.read() == (REPO / "LICENSE").read_bytes()
    env, names, head = zipapp_names(archive, exe)
    assert head.startswith(b"#!/usr/bin/env python3\n")
    assert env["entry_point"] == f"{MODULES[plugin]}:main"
    top = {PurePosixPath(n).parts[1] for n in names if n.startswith("site-packages/")
           and len(PurePosixPath(n).parts) > 2}
    assert {"aggapi", "aiohttp", "yaml", "rich", "multidict", "yarl"} <= top
    assert not top & set(release.SERVER_ONLY), sorted(top & set(release.SERVER_ONLY))
    sos = [n for n in names if n.endswith(".so")]
    assert any("/aiohttp/" in n for n in sos) and any("/yaml/" in n for n in sos)
    assert all(n.endswith(SO_TAG[platform]) for n in sos), sos
    if platform in MACHO_CPU:  # the same file name on both macOS arches: check the header
        with tarfile.open(archive) as tar:
            f = tar.extractfile(exe)
            assert f is not None
            with zipfile.ZipFile(f) as z:
                so = next(n for n in sos if "/yaml/" in n)
                macho = z.read(so)[:8]
        assert macho[:4] == b"\xcf\xfa\xed\xfe" and macho[4:8] == MACHO_CPU[platform]


PROBE = """
import json, sys
try:
    import grpc
    grpc_found = True
except ImportError:
    grpc_found = False
import aggapi.plugins.ncp, aggapi.plugins.image_pull_progress, yaml, aiohttp, rich
print(json.dumps({"path": sys.path, "aggapi": aggapi.__file__, "yaml": yaml.__file__,
                  "grpc": grpc_found, "flags": [sys.flags.isolated, sys.flags.no_site]}))
"""


def test_linux_amd64_zipapp_runs_on_an_isolated_interpreter(plugin_release: Path,
                                                            tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    release.install_zipapps(plugin_release, bin_dir)
    home = tmp_path / "home"
    env = release.isolated_env(bin_dir, home)
    for plugin, exe in release.EXES.items():
        r = subprocess.run([str(bin_dir / exe), "--help"], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert f"usage: kubectl {plugin}" in r.stdout, r.stdout
    # shiv's interpreter mode runs code with the zipapp's environment.
    r = subprocess.run([str(bin_dir / "kubectl-ncp"), "-c", PROBE],
                       env={**env, "SHIV_INTERPRETER": "1"}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.splitlines()[-1])
    shiv_root = str(home / ".shiv")
    assert seen["flags"] == [1, 1]
    assert seen["aggapi"].startswith(shiv_root) and seen["yaml"].startswith(shiv_root)
    assert seen["grpc"] is False
    outside = [p for p in seen["path"] if "-packages" in p and not p.startswith(shiv_root)]
    assert outside == []


async def test_linux_amd64_completers_print_completions(plugin_release: Path,
                                                        tmp_path: Path,
                                                        cluster: FakeCluster) -> None:
    """The archive's kubectl_complete-* run the zipapp beside them (here through a
    symlink on PATH, as the README says to install them) and print cobra's format with
    candidates from the API; real kubectl relays them for ``kubectl __complete``."""
    unpacked, bin_dir = tmp_path / "unpacked", tmp_path / "bin"
    release.install_zipapps(plugin_release, unpacked, completers=True)
    bin_dir.mkdir()
    for name in (*release.EXES.values(), *release.COMPLETERS.values(), "python3"):
        (bin_dir / name).symlink_to(unpacked / name)
    cluster.workloads["deployments"] = ["web-deploy"]
    env = release.isolated_env(bin_dir, tmp_path / "home",
                               KUBECONFIG=str(cluster.kubeconfig()))
    r = await asyncio.to_thread(
        subprocess.run, [str(bin_dir / "kubectl_complete-ncp"), "w"], env=env,
        capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["web:", ":2"], r.stdout
    r = await asyncio.to_thread(
        subprocess.run, [str(bin_dir / "kubectl_complete-image_pull_progress"),
                         "deployment/"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["deployment/web-deploy", ":4"], r.stdout
    if os.access(KUBECTL, os.X_OK):
        res = await kubectl(env, "__complete", "ncp", "w")
        assert res.rc == 0 and res.out.splitlines()[0] == "web:", (res.out, res.err)


def test_a_second_build_gives_the_same_archives(plugin_release: Path, tmp_path: Path) -> None:
    """Same tree, same bytes: the manifests' sha256 values do not move between builds."""
    again = release.build(tmp_path / "again")
    names = sorted(p.name for p in plugin_release.glob("*.tar.gz"))
    assert len(names) == len(release.PLATFORMS) * len(release.EXES)
    assert sorted(p.name for p in again.glob("*.tar.gz")) == names
    for name in names:
        assert (again / name).read_bytes() == (plugin_release / name).read_bytes(), name
    for name in ("ncp.yaml", "image-pull-progress.yaml"):
        assert (again / "krew" / name).read_text() == (plugin_release / "krew" / name).read_text()


def newer_pythons() -> list[Path]:
    """CPython 3.12+ interpreters on this machine (PATH or pyenv), if any."""
    found: dict[str, Path] = {}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [*(shutil.which(f"python3.{m}") for m in range(12, 16)),
                  *map(str, sorted(pyenv.glob("3.1[2-9]*/bin/python3")))]
    for c in candidates:
        if not c:
            continue
        r = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2] >= (3, 12), "
                            "sys.implementation.name, sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode == 0 and r.stdout.startswith("True cpython"):
            found.setdefault(r.stdout, Path(c))
    return list(found.values())


def test_zipapp_runs_on_newer_pythons_without_its_cp311_extensions(plugin_release: Path,
                                                                   tmp_path: Path) -> None:
    """The wheels are CPython 3.11's; on 3.12+ aiohttp, multidict, yarl and PyYAML load
    their pure-Python fallbacks, so the zipapp still runs (the manifests say >= 3.11)."""
    pythons = newer_pythons()
    if not pythons:
        pytest.skip("no CPython 3.12+ on this machine")
    for py in pythons:
        bin_dir = tmp_path / py.parent.parent.name / "bin"
        release.install_zipapps(plugin_release, bin_dir, python=py)
        env = release.isolated_env(bin_dir, tmp_path / "home" / py.parent.parent.name)
        r = subprocess.run([str(bin_dir / "kubectl-ncp"), "-c", PROBE],
                           env={**env, "SHIV_INTERPRETER": "1"}, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, (py, r.stderr)
        assert json.loads(r.stdout.splitlines()[-1])["grpc"] is False
        r = subprocess.run([str(bin_dir / "kubectl-image_pull_progress"), "--help"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "usage: kubectl image-pull-progress" in r.stdout, r.stderr
