"""A validator of krew plugin manifests (our own, after the rules krew's index applies):
the API version and kind, a safe name equal to the file's, a ``v``-prefixed semantic
version, shortDescription and homepage, and per platform an os/arch selector, a uri, a
lowercase hex sha256, ``files`` and a ``bin`` among the installed files. Given the
archives, it also checks that each sha256 is the archive's and that the archive holds
every ``from`` path, with ``bin`` executable.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

API_VERSION = "krew.googlecontainertools.github.com/v1alpha2"
NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$")
SHA256 = re.compile(r"^[a-f0-9]{64}$")
OSES = {"linux", "darwin", "windows"}
ARCHES = {"amd64", "arm64", "386", "arm", "ppc64le", "s390x"}
ARCHIVE = re.compile(r"\.(tar\.gz|tgz|zip)$")


def installed_path(entry: dict[str, Any]) -> str:
    """Where krew puts ``from`` when it copies it to ``to`` ("." keeps the base name)."""
    to = str(entry["to"])
    if to in (".", "./") or to.endswith("/"):
        return str(PurePosixPath(to) / PurePosixPath(str(entry["from"])).name)
    return str(PurePosixPath(to))


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _platform(i: int, p: Any, archive_for: Callable[[str], Path] | None) -> list[str]:
    where = f"spec.platforms[{i}]"
    if not isinstance(p, dict):
        return [f"{where}: not a mapping"]
    errs = []
    sel = p.get("selector")
    labels = sel.get("matchLabels") if isinstance(sel, dict) else None
    if not isinstance(labels, dict):
        errs.append(f"{where}.selector: needs matchLabels with os and arch")
    else:
        if labels.get("os") not in OSES:
            errs.append(f"{where}.selector: os {labels.get('os')!r} is not one of {OSES}")
        if labels.get("arch") not in ARCHES:
            errs.append(f"{where}.selector: arch {labels.get('arch')!r} is unknown")
    uri = p.get("uri")
    if not (_text(uri) and re.match(r"^https?://", str(uri)) and ARCHIVE.search(str(uri))):
        errs.append(f"{where}.uri: {uri!r} is not an http(s) URL of a .tar.gz or .zip")
    sha = p.get("sha256")
    if not (isinstance(sha, str) and SHA256.match(sha)):
        errs.append(f"{where}.sha256: {sha!r} is not 64 lowercase hex digits")
    files = p.get("files")
    if not (isinstance(files, list) and files and all(
            isinstance(f, dict) and _text(f.get("from")) and _text(f.get("to"))
            for f in files)):
        errs.append(f"{where}.files: needs a non-empty list of {{from, to}}")
        files = []
    binary = p.get("bin")
    if not _text(binary):
        errs.append(f"{where}.bin: missing")
    elif str(PurePosixPath(str(binary))) not in {installed_path(f) for f in files}:
        errs.append(f"{where}.bin: {binary!r} is not among the files' destinations")
    if archive_for is not None and not errs:
        errs += _archive(where, p, archive_for(str(uri)))
    return errs


def _archive(where: str, p: dict[str, Any], path: Path) -> list[str]:
    if not path.is_file():
        return [f"{where}: archive {path} does not exist"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    errs = []
    if digest != p["sha256"]:
        errs.append(f"{where}.sha256: {p['sha256']} but the archive's is {digest}")
    with tarfile.open(path) as tar:
        members = {str(PurePosixPath(m.name)): m for m in tar.getmembers()}
    for f in p["files"]:
        if str(PurePosixPath(f["from"])) not in members:
            errs.append(f"{where}.files: {f['from']!r} is not in {path.name}")
    for f in p["files"]:
        m = members.get(str(PurePosixPath(f["from"])))
        if m is not None and installed_path(f) == str(PurePosixPath(p["bin"])):
            if not (m.isfile() and m.mode & 0o111):
                errs.append(f"{where}.bin: {f['from']!r} is not an executable file")
    return errs


def validate(doc: Any, file_name: str,
             archive_for: Callable[[str], Path] | None = None) -> list[str]:
    """The rules ``doc`` (a loaded manifest from ``file_name``) breaks; [] when none.
    ``archive_for`` maps a platform's uri to the local archive to check against."""
    if not isinstance(doc, dict):
        return ["not a mapping"]
    errs = []
    if doc.get("apiVersion") != API_VERSION:
        errs.append(f"apiVersion: {doc.get('apiVersion')!r}, want {API_VERSION}")
    if doc.get("kind") != "Plugin":
        errs.append(f"kind: {doc.get('kind')!r}, want Plugin")
    meta = _mapping(doc.get("metadata"))
    name = meta.get("name")
    if not (isinstance(name, str) and NAME.match(name)):
        errs.append(f"metadata.name: {name!r} is not a safe plugin name")
    if name != PurePosixPath(file_name).name.removesuffix(".yaml"):
        errs.append(f"metadata.name: {name!r} does not match the file name {file_name}")
    spec = _mapping(doc.get("spec"))
    if not (isinstance(spec.get("version"), str) and SEMVER.match(spec["version"])):
        errs.append(f"spec.version: {spec.get('version')!r} is not vMAJOR.MINOR.PATCH")
    if not _text(spec.get("shortDescription")):
        errs.append("spec.shortDescription: missing")
    if not (_text(spec.get("homepage")) and str(spec["homepage"]).startswith("https://")):
        errs.append("spec.homepage: missing or not https")
    platforms = spec.get("platforms")
    if not (isinstance(platforms, list) and platforms):
        return [*errs, "spec.platforms: needs at least one platform"]
    seen: set[tuple[object, object]] = set()
    for i, p in enumerate(platforms):
        errs += _platform(i, p, archive_for)
        labels = (p.get("selector") or {}).get("matchLabels") if isinstance(p, dict) else None
        if isinstance(labels, dict):
            key = (labels.get("os"), labels.get("arch"))
            if key in seen:
                errs.append(f"spec.platforms[{i}]: a second platform for {key}")
            seen.add(key)
    return errs


def caveat_command(doc: dict[str, Any], command: str) -> str:
    """The one line of spec.caveats that runs ``command`` (e.g. "ln -sf"), as a user
    would paste it into a shell."""
    lines = [ln.strip() for ln in str(doc["spec"].get("caveats", "")).splitlines()
             if re.search(rf"(^|; ){re.escape(command)} ", ln.strip())]
    assert len(lines) == 1, f"want one {command!r} line in the caveats, got {lines}"
    return lines[0]
