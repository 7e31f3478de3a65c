"""Helpers of hack/build-plugins.sh: the plugins' requirements, reproducible archives and
krew manifests rendered from the templates in plugins/krew/.

    plugin_release.py requirements                  the pip requirements of the zipapps
    plugin_release.py archive OUT.tar.gz FILE...    a deterministic tar.gz of FILEs
    plugin_release.py completer PLUGIN OUT          the kubectl_complete-<plugin> launcher
    plugin_release.py manifest TEMPLATE OUT VERSION BASE_URL ARCHIVE_DIR PLATFORM...

Standard library only, apart from PyYAML for the manifests (as the project uses).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import sys
import tarfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Core dependencies the plugins import (aggapi.client, aggapi.kube.kubeconfig); the rest of
# the core (gRPC, protobuf, prometheus, cryptography, pyjwt, uvloop) is the servers'.
PLUGIN_CORE_DEPS = {"aiohttp", "pyyaml"}
# The executable in each plugin's archive: kubectl finds kubectl-<name> on PATH, with
# "-" in a plugin name written "_" in the file name.
PLUGINS = {"ncp": "kubectl-ncp", "image-pull-progress": "kubectl-image_pull_progress"}
# kubectl's plugin-completion hook for each (kubectl_complete-<file name's plugin part>)
# and the function of aggapi.plugins.complete it runs.
COMPLETERS = {"ncp": ("kubectl_complete-ncp", "aggapi.plugins.complete:ncp_main"),
              "image-pull-progress": ("kubectl_complete-image_pull_progress",
                                      "aggapi.plugins.complete:image_pull_progress_main")}
# The completion executable: a few lines of Python that run the plugin's zipapp (found
# beside the real file, through any symlink on PATH) with shiv's entry point switched to
# the completer, so the archive carries its dependencies once.
COMPLETER = """#!/usr/bin/env python3
# kubectl_complete-{name}: shell completion for `kubectl {name}` (kubectl 1.26+ runs
# it on TAB). Put it on PATH next to {exe}, e.g. ln -s "$PWD/{completer}" ~/.local/bin/
import os
import sys

here = os.path.dirname(os.path.realpath(__file__))
exe = os.path.join(here, "{exe}")
env = dict(os.environ, SHIV_ENTRY_POINT="{entry}")
try:
    os.execve(exe, [exe, *sys.argv[1:]], env)
except OSError:  # no plugin beside it: offer nothing, as a failing API would
    print(":4")
"""


def dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = [r for r in project["dependencies"] if dist_name(r) in PLUGIN_CORE_DEPS]
    missing = PLUGIN_CORE_DEPS - {dist_name(r) for r in core}
    if missing:
        raise SystemExit(f"pyproject.toml no longer lists {sorted(missing)}")
    return core + list(project["optional-dependencies"]["plugins"])


def archive_name(plugin: str, version: str, platform: str) -> str:
    os_, arch = platform.split("/")
    return f"{PLUGINS[plugin]}-{version}-{os_}-{arch}.tar.gz"


def write_completer(plugin: str, out: Path) -> None:
    completer, entry = COMPLETERS[plugin]
    out.write_text(COMPLETER.format(name=plugin, exe=PLUGINS[plugin], completer=completer,
                                    entry=entry))
    out.chmod(0o755)


def write_archive(out: Path, files: list[Path]) -> None:
    """tar.gz with the files at its top level: fixed mtime (SOURCE_DATE_EPOCH), owner 0,
    modes 0755/0644 and no gzip timestamp, so one input gives one sha256."""
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda p: p.name):
            info = tarfile.TarInfo(f.name)
            info.size = f.stat().st_size
            info.mtime = mtime
            info.mode = 0o755 if os.access(f, os.X_OK) else 0o644
            info.uname = info.gname = "root"
            with f.open("rb") as fh:
                tar.addfile(info, fh)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                               mtime=0, compresslevel=9) as gz:
        gz.write(buf.getvalue())
    tmp.replace(out)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render_manifest(template: Path, out: Path, version: str, base_url: str,
                    archive_dir: Path, platforms: list[str]) -> None:
    """The template with spec.version and one platform entry per archive (uri from
    BASE_URL, sha256 of the archive as built)."""
    import yaml

    doc = yaml.safe_load(template.read_text())
    plugin = doc["metadata"]["name"]
    exe = PLUGINS[plugin]
    entries = []
    for platform in platforms:
        os_, arch = platform.split("/")
        name = archive_name(plugin, version, platform)
        entries.append({
            "selector": {"matchLabels": {"os": os_, "arch": arch}},
            "uri": f"{base_url.rstrip('/')}/{name}",
            "sha256": sha256(archive_dir / name),
            # krew links only ``bin`` onto PATH; the completer is installed beside it
            # (the caveats say how to link it too).
            "files": [{"from": exe, "to": "."}, {"from": COMPLETERS[plugin][0], "to": "."},
                      {"from": "LICENSE", "to": "."}],
            "bin": exe,
        })
    doc["spec"]["version"] = version
    doc["spec"]["platforms"] = entries
    header = (f"# Rendered by hack/build-plugins.sh from plugins/krew/{template.name} "
              f"for {version}.\n")
    out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "requirements":
        print("\n".join(requirements()))
    elif cmd == "archive":
        write_archive(Path(args[0]), [Path(a) for a in args[1:]])
    elif cmd == "completer":
        write_completer(args[0], Path(args[1]))
    elif cmd == "archive-name":
        print(archive_name(*args))
    elif cmd == "manifest":
        template, out, version, base_url, archive_dir, *platforms = args
        render_manifest(Path(template), Path(out), version, base_url, Path(archive_dir),
                        platforms)
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
