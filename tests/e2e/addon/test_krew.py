"""The kubectl plugins installed with krew, as users install them, against the installed
add-on.

krew v0.4.3 (hack/build-binaries.sh krew, the ``kubectl-krew`` plugin) installs both
plugins with ``kubectl krew install --manifest=… --archive=…`` from hack/build-plugins.sh's
output, offline: KREW_ROOT in a temp dir, KREW_NO_UPGRADE_CHECK set, its default index a
local git repository holding the release's manifests (``list`` and ``uninstall`` want an
index), and HTTP(S)_PROXY at a closed port, so fetching an archive or a manifest would
fail the step (install without --archive fails so). PATH is KREW_ROOT/bin, a bin dir of
the test's (kubectl, kubectl-krew, an isolated python3 for the zipapps) and /usr/bin:/bin
(git, sh); HOME is empty.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.e2e.addon.helpers import delete_pods, run_pod
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster
from tests.framework.kubetools import binary
from tests.plugins import release
from tests.plugins.helpers import KUBECTL, Run, kubectl
from tests.plugins.krew_rules import caveat_command

pytestmark = pytest.mark.e2e

POD = "krew-sleeper"
PLUGINS = sorted(release.EXES)  # krew names: image-pull-progress, ncp


@dataclass
class Krew:
    root: Path
    env: dict[str, str]
    release: Path

    def manifest(self, plugin: str) -> Path:
        return self.release / "krew" / f"{plugin}.yaml"

    def caveat(self, plugin: str, command: str) -> str:
        return caveat_command(yaml.safe_load(self.manifest(plugin).read_text()), command)

    def krew(self, *args: str) -> Run:
        # krew itself gets a proxy nobody listens on: it must never need the network.
        proxy = "http://127.0.0.1:9"
        env = {**self.env, "HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "NO_PROXY": ""}
        return asyncio.run(kubectl(env, "krew", *args))

    def install(self) -> None:
        for plugin in PLUGINS:
            archive = release.archive(self.release, plugin, "linux/amd64")
            r = self.krew("install", f"--manifest={self.manifest(plugin)}",
                          f"--archive={archive}")
            assert r.rc == 0, r.err
            assert f"Installed plugin: {plugin}" in r.err, r.err

    def sh(self, line: str) -> None:
        subprocess.run(["/bin/sh", "-c", line], env=self.env, check=True, timeout=10)

    def kubectl(self, *args: str, timeout: float = 120) -> Run:
        return asyncio.run(kubectl(self.env, *args, timeout=timeout))

    def listed(self) -> set[str]:
        """The kubectl plugins ``kubectl plugin list`` finds under KREW_ROOT/bin."""
        r = self.kubectl("plugin", "list")
        return {Path(ln.strip()).name for ln in r.out.splitlines()
                if ln.strip().startswith(f"{self.root}/bin/")}

    def complete(self, *words: str) -> tuple[list[str], str]:
        r = self.kubectl("__complete", *words, timeout=30)
        assert r.rc == 0, r.err
        lines = r.out.splitlines()
        assert lines and lines[-1].startswith(":"), r.out
        return lines[:-1], lines[-1]


def new_krew(plugin_release: Path, base: Path, kubeconfig: Path) -> Krew:
    tools, index, home = base / "tools", base / "index", base / "home"
    tools.mkdir(parents=True)
    home.mkdir()
    (tools / "kubectl").symlink_to(os.path.realpath(KUBECTL))
    (tools / "kubectl-krew").symlink_to(os.path.realpath(binary("kubectl-krew")))
    release.isolated_python3(tools)
    # A plugin index as krew's: a git repository with plugins/<name>.yaml.
    (index / "plugins").mkdir(parents=True)
    for plugin in PLUGINS:
        (index / "plugins" / f"{plugin}.yaml").write_bytes(
            (plugin_release / "krew" / f"{plugin}.yaml").read_bytes())
    git = ["git", "-C", str(index), "-c", "user.name=test", "-c", "user.email=test@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "index"]):
        subprocess.run([*git, *args], check=True, timeout=30)
    root = base / "krew-root"
    env = {"PATH": f"{root}/bin:{tools}:/usr/bin:/bin", "HOME": str(home),
           "LANG": "C.UTF-8", "KREW_ROOT": str(root), "KREW_NO_UPGRADE_CHECK": "1",
           "KREW_DEFAULT_INDEX_URI": str(index), "KUBECONFIG": str(kubeconfig)}
    k = Krew(root, env, plugin_release)
    r = k.krew("update")  # clones the local index: no network
    assert r.rc == 0 and (root / "index/default/plugins/ncp.yaml").is_file(), r.err
    return k


@pytest.fixture(scope="module")
def sleeper(installed_addon: Addon, two_node_cluster: Cluster) -> Iterator[str]:
    cp = installed_addon.cp
    run_pod(cp, POD, two_node_cluster.nodes[1].name)
    yield POD
    delete_pods(cp, POD)


@pytest.fixture(scope="module")
def krewed(installed_addon: Addon, plugin_release: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Krew:
    """Both plugins installed with krew into a KREW_ROOT of the module's."""
    k = new_krew(plugin_release, tmp_path_factory.mktemp("krew"),
                 installed_addon.cp.admin_kubeconfig)
    k.install()
    return k


def test_krew_installs_both_plugins_offline_and_kubectl_finds_them(krewed: Krew) -> None:
    r = krewed.krew("list")
    assert r.rc == 0, r.err
    assert {ln.rsplit("/", 1)[-1] for ln in r.out.split()} == set(PLUGINS)
    assert krewed.listed() == set(release.EXES.values())
    for plugin in PLUGINS:
        receipt = yaml.safe_load((krewed.root / "receipts" / f"{plugin}.yaml").read_text())
        assert receipt["spec"]["version"] == release.VERSION


def test_plugins_run_through_kubectl_against_the_addon(krewed: Krew, sleeper: str,
                                                       tmp_path: Path) -> None:
    r = krewed.kubectl("image-pull-progress", sleeper, "-o", "json")
    assert r.rc == 0, r.err
    last = json.loads(r.out.splitlines()[-1])
    assert last["kind"] == "Summary", last
    assert last["images"] and all(i["phase"] in ("Done", "AlreadyPresent")
                                  for i in last["images"]), last
    src, back = tmp_path / "up.bin", tmp_path / "back.bin"
    src.write_bytes(os.urandom(256 << 10))
    remote = f"default/{sleeper}:/tmp/krew-copy.bin"
    r = krewed.kubectl("ncp", "-c", "c", str(src), remote)
    assert r.rc == 0, r.err
    r = krewed.kubectl("ncp", "-c", "c", remote, str(back))
    assert r.rc == 0, r.err
    assert hashlib.sha256(back.read_bytes()).hexdigest() == \
        hashlib.sha256(src.read_bytes()).hexdigest()
    # The zipapps krew installed ran (unpacked under the empty HOME), not another copy.
    assert any((Path(krewed.env["HOME"]) / ".shiv").glob("kubectl-ncp_*"))


def test_tab_completion_through_kubectl_once_linked_as_the_caveats_say(
        krewed: Krew, sleeper: str) -> None:
    prefix = sleeper[:6]
    # krew links only the plugin: kubectl finds no completer, so no pod is offered.
    got, _ = krewed.complete("ncp", prefix)
    assert f"{sleeper}:" not in got
    for plugin in PLUGINS:
        krewed.sh(krewed.caveat(plugin, "ln -sf"))
    got, directive = krewed.complete("ncp", prefix)
    assert f"{sleeper}:" in got and directive == ":2", (got, directive)  # no space after ':'
    got, directive = krewed.complete("image-pull-progress", prefix)
    assert sleeper in got and directive == ":4", (got, directive)
    got, directive = krewed.complete("image-pull-progress", sleeper, "-c", "")
    assert (got, directive) == (["c"], ":4")


def test_uninstall_leaves_nothing_behind(installed_addon: Addon, plugin_release: Path,
                                         tmp_path: Path) -> None:
    k = new_krew(plugin_release, tmp_path, installed_addon.cp.admin_kubeconfig)
    k.install()
    for plugin in PLUGINS:
        k.sh(k.caveat(plugin, "ln -sf"))
    assert len(list((k.root / "bin").iterdir())) == 4
    for plugin in PLUGINS:
        r = k.krew("uninstall", plugin)
        assert r.rc == 0 and f"Uninstalled plugin: {plugin}" in r.err, r.err
        k.sh(k.caveat(plugin, "rm -f"))
    for d in ("receipts", "store", "bin"):
        assert list((k.root / d).iterdir()) == [], d
    assert k.listed() == set()
    r = k.krew("list")
    assert r.rc == 0 and r.out.strip() == "", r.out
    r = k.kubectl("ncp", "--help")
    assert r.rc != 0 and "unknown command" in r.err, r.err
