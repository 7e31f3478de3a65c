"""The krew manifest validator (tests/plugins/krew_rules.py) accepts a good manifest and
reports each broken rule, including a sha256 or file list that disagrees with the archive."""

from __future__ import annotations

import copy
import hashlib
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.krew_rules import validate

URI = "https://releases.example.com/v1.2.3/kubectl-foo-v1.2.3-linux-amd64.tar.gz"


def make_archive(path: Path, *, exe_mode: int = 0o755) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, mode in (("kubectl-foo", exe_mode), ("LICENSE", 0o644)):
            src = path.parent / name
            src.write_bytes(b"#!/bin/sh\n" if name != "LICENSE" else b"license\n")
            info = tar.gettarinfo(str(src), arcname=name)
            info.mode = mode
            with src.open("rb") as f:
                tar.addfile(info, f)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def good(sha: str) -> dict[str, Any]:
    return {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": "foo"},
        "spec": {
            "version": "v1.2.3",
            "homepage": "https://example.com/foo",
            "shortDescription": "does foo",
            "platforms": [{
                "selector": {"matchLabels": {"os": "linux", "arch": "amd64"}},
                "uri": URI,
                "sha256": sha,
                "files": [{"from": "kubectl-foo", "to": "."}, {"from": "LICENSE", "to": "."}],
                "bin": "kubectl-foo",
            }],
        },
    }


def platform0(doc: dict[str, Any]) -> dict[str, Any]:
    p: dict[str, Any] = doc["spec"]["platforms"][0]
    return p


def set_(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return apply


BROKEN: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "api version": (set_("apiVersion", "krew.googlecontainertools.github.com/v1alpha1"),
                    "apiVersion"),
    "kind": (set_("kind", "Plug"), "kind"),
    "name not the file's": (set_("metadata.name", "bar"), "file name"),
    "unsafe name": (set_("metadata.name", "../foo"), "safe plugin name"),
    "version without v": (set_("spec.version", "1.2.3"), "spec.version"),
    "version not semver": (set_("spec.version", "v1.2"), "spec.version"),
    "no short description": (set_("spec.shortDescription", ""), "shortDescription"),
    "no homepage": (set_("spec.homepage", None), "homepage"),
    "no platforms": (set_("spec.platforms", []), "platforms"),
    "no selector": (set_("spec.platforms.0.selector", None), "selector"),
    "bad os": (set_("spec.platforms.0.selector", {"matchLabels": {"os": "beos",
                                                                  "arch": "amd64"}}), "os"),
    "bad arch": (set_("spec.platforms.0.selector", {"matchLabels": {"os": "linux",
                                                                    "arch": "x86_64"}}), "arch"),
    "uri not an archive": (set_("spec.platforms.0.uri", "https://x/kubectl-foo"), "uri"),
    "uppercase sha": (lambda d: platform0(d).update(sha256=platform0(d)["sha256"].upper()),
                      "sha256"),
    "short sha": (set_("spec.platforms.0.sha256", "ab" * 31), "sha256"),
    "zero sha": (set_("spec.platforms.0.sha256", "0" * 64), "archive's is"),
    "no files": (set_("spec.platforms.0.files", []), "files"),
    "bin not installed": (set_("spec.platforms.0.bin", "kubectl-bar"), "destinations"),
    "from not in archive": (lambda d: platform0(d)["files"].append({"from": "README",
                                                                     "to": "."}),
                            "not in"),
    "second linux/amd64": (lambda d: d["spec"]["platforms"].append(
        copy.deepcopy(platform0(d))), "second platform"),
}


def test_a_good_manifest_passes(tmp_path: Path) -> None:
    sha = make_archive(tmp_path / "a.tar.gz")
    assert validate(good(sha), "foo.yaml", lambda uri: tmp_path / "a.tar.gz") == []


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_rule_is_reported(tmp_path: Path, case: str) -> None:
    sha = make_archive(tmp_path / "a.tar.gz")
    doc = good(sha)
    mutate, expect = BROKEN[case]
    mutate(doc)
    errs = validate(doc, "foo.yaml", lambda uri: tmp_path / "a.tar.gz")
    assert errs and any(expect in e for e in errs), errs


def test_bin_must_be_executable_in_the_archive(tmp_path: Path) -> None:
    sha = make_archive(tmp_path / "a.tar.gz", exe_mode=0o644)
    errs = validate(good(sha), "foo.yaml", lambda uri: tmp_path / "a.tar.gz")
    assert errs == ["spec.platforms[0].bin: 'kubectl-foo' is not an executable file"]


def test_the_committed_templates_are_valid_apart_from_platforms() -> None:
    import yaml

    from tests.framework.repo import REPO
    for path in sorted((REPO / "plugins/krew").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert validate(doc, path.name) == ["spec.platforms: needs at least one platform"]
