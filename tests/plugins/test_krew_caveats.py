"""The shell lines the krew manifests' caveats give for completion work as pasted: the
link line puts the completer krew installed into the store onto krew's bin dir (the
one on PATH), under KREW_ROOT when set and ~/.krew otherwise; the remove line, run
after ``kubectl krew uninstall``, leaves no link behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.framework.repo import REPO
from tests.plugins import release
from tests.plugins.krew_rules import caveat_command


def krew_layout(root: Path, plugin: str) -> Path:
    """What ``kubectl krew install`` leaves: store/<plugin>/<version>/ with the
    completer, bin/ with the plugin's link. The completer's path."""
    store = root / "store" / plugin / "v1.2.3"
    store.mkdir(parents=True)
    completer = store / release.COMPLETERS[plugin]
    completer.write_text("#!/bin/sh\n")
    completer.chmod(0o755)
    (root / "bin").mkdir()
    (root / "bin" / release.EXES[plugin]).symlink_to(store / release.EXES[plugin])
    return completer


def sh(line: str, **env: str) -> None:
    subprocess.run(["/bin/sh", "-c", line], check=True, timeout=10,
                   env={"PATH": os.defpath, **env})


@pytest.mark.parametrize("krew_root_set", [True, False])
@pytest.mark.parametrize("plugin", sorted(release.EXES))
def test_caveats_link_and_unlink_the_completer(plugin: str, krew_root_set: bool,
                                               tmp_path: Path) -> None:
    doc = yaml.safe_load((REPO / "plugins/krew" / f"{plugin}.yaml").read_text())
    home = tmp_path / "home"
    root = tmp_path / "krew" if krew_root_set else home / ".krew"
    completer = krew_layout(root, plugin)
    env = {"HOME": str(home), **({"KREW_ROOT": str(root)} if krew_root_set else {})}
    link = root / "bin" / release.COMPLETERS[plugin]
    sh(caveat_command(doc, "ln -sf"), **env)
    assert link.is_symlink() and link.resolve() == completer.resolve()
    # krew uninstall removes the store and the plugin's own link only.
    (root / "bin" / release.EXES[plugin]).unlink()
    completer.unlink()
    sh(caveat_command(doc, "rm -f"), **env)
    assert not link.is_symlink() and list((root / "bin").iterdir()) == []
