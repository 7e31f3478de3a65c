"""The Dockerfile and the image built from it.

Static checks of the Dockerfile (multi-stage, base pinned by digest, non-root by default),
then the real thing: hack/build-image.sh builds the image with buildah from a Debian base
(no Docker engine here), and the test looks into the OCI archive's layers (server only:
no test harness, no plugin-only packages, no compiler, size target) and runs the image
under containerd, the node's runtime, with ctr."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

import aggapi
from tests.manifests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
BUILD = REPO / "hack/build-image.sh"
IMAGE = "localhost/aggapi:dev"
# The target for the uncompressed image (base root filesystem + venv).
MAX_IMAGE_BYTES = 220_000_000
# Only the client plugins use these: they belong in the aggapi[plugins] extra.
PLUGIN_PACKAGES = {"rich": "rich", "kubernetes-asyncio": "kubernetes_asyncio"}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for ins, args in _instructions():
        if ins == "FROM":
            name = args.split()[-1] if " AS " in args.upper() else str(len(stages))
            current = stages.setdefault(name, [])
        if current is not None:
            current.append((ins, args))
    return stages


def test_multistage_pinned_non_root() -> None:
    ins = _instructions()
    args = dict(a.split("=", 1) for i, a in ins if i == "ARG" and "=" in a)
    assert re.search(r"@sha256:[0-9a-f]{64}$", args["PYTHON_IMAGE"]), args["PYTHON_IMAGE"]
    stages = _stages()
    assert list(stages) == ["compile", "build", "runtime"]
    assert stages["compile"][0][1].startswith("${COMPILE_IMAGE}")
    runtime = stages["runtime"]
    assert runtime[0][1].startswith("${PYTHON_IMAGE}")
    assert any(i == "COPY" and a.startswith("--from=build ") for i, a in runtime)
    # From the compile stage only its output tree (the .so), never its compiler.
    assert [a for i, a in runtime if i == "COPY" and "--from=compile" in a] == [
        "--from=compile /out/opt/aggapi /opt/aggapi"]
    user = [a for i, a in runtime if i == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert ("ENTRYPOINT", '["aggapi"]') in runtime
    assert not [a for i, a in runtime if i == "RUN"], "the runtime stage installs nothing"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().split()
    assert lines[lines.index("*")] == "*"
    # Everything is ignored, then only these come back: tests/ (the harness) never does.
    assert {x for x in lines if x.startswith("!")} == {
        "!pyproject.toml", "!README.md", "!aggapi/", "!wheels/"}



# --- the built image ------------------------------------------------------------------


def _server_extra() -> set[str]:
    """Names (normalised) of the "server" extra, which the image installs."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    return {re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower().replace("_", "-")
            for d in extras["server"]}


def _core_dependencies() -> set[str]:
    """Names (normalised) of pyproject's core dependencies, extras not included."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower().replace("_", "-")
            for d in deps}


@dataclass(frozen=True)
class Archive:
    path: Path
    build_log: str
    config: dict[str, Any]
    files: dict[str, tarfile.TarInfo]  # the image's root filesystem: path -> entry

    def size(self, under: str = "") -> int:
        return sum(t.size for p, t in self.files.items()
                   if t.isfile() and (not under or p.startswith(under.rstrip("/") + "/")))

    def site_packages(self) -> set[str]:
        """Top-level names in the venv's site-packages."""
        pat = re.compile(r"^opt/aggapi/lib/python3\.\d+/site-packages/([^/]+)")
        return {m.group(1) for p in self.files if (m := pat.match(p))}


def _member(oci: tarfile.TarFile, name: str) -> IO[bytes]:
    f = oci.extractfile(name)
    assert f is not None, name
    return f


def _blob(oci: tarfile.TarFile, digest: str) -> IO[bytes]:
    return _member(oci, "blobs/" + digest.replace(":", "/"))


def _apply_layer(files: dict[str, tarfile.TarInfo], layer: tarfile.TarFile) -> None:
    """Apply one layer to ``files`` as an overlay would, whiteouts included."""
    for t in layer:
        path = t.name.removeprefix("./").rstrip("/")
        parent, _, base = path.rpartition("/")
        if base == ".wh..wh..opq":  # opaque directory: drop what lower layers had in it
            for p in [p for p in files if p.startswith(parent + "/")]:
                del files[p]
        elif base.startswith(".wh."):
            gone = f"{parent}/{base[4:]}".lstrip("/")
            for p in [p for p in files if p == gone or p.startswith(gone + "/")]:
                del files[p]
        elif path:
            files[path] = t


def read_archive(path: Path, build_log: str) -> Archive:
    with tarfile.open(path) as oci:
        index = json.load(_member(oci, "index.json"))
        [desc] = index["manifests"]
        assert desc["annotations"]["org.opencontainers.image.ref.name"] == IMAGE, \
            "the archive must carry the image name, or ctr imports it nameless"
        manifest = json.load(_blob(oci, desc["digest"]))
        config = json.load(_blob(oci, manifest["config"]["digest"]))
        files: dict[str, tarfile.TarInfo] = {}
        for layer in manifest["layers"]:
            # Stream mode, compression (gzip or none) detected from the data.
            with tarfile.open(fileobj=_blob(oci, layer["digest"]), mode="r|*") as lt:
                _apply_layer(files, lt)
    return Archive(path, build_log, config, files)


@pytest.fixture(scope="module")
def archive() -> Archive:
    """The image, built by hack/build-image.sh (which skips the work when its inputs are
    unchanged since the archive it keeps in its cache was written)."""
    r = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"hack/build-image.sh failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    print(r.stdout)
    m = re.search(r"^build-image: archive (\S+) ", r.stdout, re.M)
    assert m, r.stdout
    return read_archive(Path(m.group(1)), r.stdout)


@pytest.mark.slow
@pytest.mark.integration  # builds the image: root, mmdebstrap, buildah
def test_image_holds_the_server_only(archive: Archive) -> None:
    cfg = archive.config["config"]
    assert cfg["Entrypoint"] == ["aggapi"] and cfg["Cmd"] == ["apiserver"]
    assert cfg["User"].split(":")[0] not in ("", "0", "root")
    site = archive.site_packages()
    assert "aggapi" in site, sorted(site)
    aggapi_files = {p.split("site-packages/", 1)[1] for p in archive.files
                    if "/site-packages/aggapi/" in p}
    assert "aggapi/cli.py" in aggapi_files and "aggapi/apiserver/app.py" in aggapi_files
    # No test harness: neither aggapi.testing nor the repo's tests, anywhere.
    assert not [p for p in aggapi_files if p.startswith("aggapi/testing")]
    assert "tests" not in site
    assert not [p for p in archive.files if p.split("/")[0] in ("src", "tests")
                or p.startswith("opt/aggapi/tests")]
    # No plugin-only dependency. While pyproject still lists one among the core
    # dependencies (the aggapi[plugins] extra takes them), pip must install it.
    core = _core_dependencies()
    for dist, module in PLUGIN_PACKAGES.items():
        if dist in core | _server_extra():
            assert module in site, f"{dist} is a core dependency but not installed"
        else:
            assert module not in site, f"{dist} is plugin-only but in the image"
    # No compiler, no pip left behind in the venv.
    compilers = re.compile(r"^usr/(bin/([\w.-]*-)?(gcc|cc|c\+\+|g\+\+|clang)(-[\d.]+)?"
                           r"|lib/gcc(/.*)?)$")
    assert not [p for p in archive.files if compilers.match(p)]
    assert not {"pip", "setuptools"} & site
    # The agent's compiled copy loops, built for the image's Python by the compile stage.
    for mod in ("agent/copy/_fastuntar", "agent/copy/_fastwalk", "tar/_fastheader"):
        assert [p for p in aggapi_files
                if re.fullmatch(rf"aggapi/{mod}\.cpython-3\d+-[\w-]+\.so", p)], mod


@pytest.mark.slow
@pytest.mark.integration  # builds the image: root, mmdebstrap, buildah
def test_image_size(archive: Archive) -> None:
    total, venv = archive.size(), archive.size("opt/aggapi")
    print(f"image {total / 1e6:.1f} MB uncompressed: base {(total - venv) / 1e6:.1f} MB, "
          f"venv {venv / 1e6:.1f} MB")
    # The sizes the script prints are those of the same root filesystem.
    assert f"venv /opt/aggapi {venv / 1e6:.1f} MB" in archive.build_log
    if set(PLUGIN_PACKAGES) & _core_dependencies():
        pytest.skip(f"the 220 MB target applies once {sorted(PLUGIN_PACKAGES)} are out of "
                    f"the core dependencies; now {total / 1e6:.1f} MB")
    assert total <= MAX_IMAGE_BYTES, f"{total / 1e6:.1f} MB > {MAX_IMAGE_BYTES / 1e6:.0f} MB"


@pytest.mark.slow
@pytest.mark.integration  # builds the image: root, mmdebstrap, buildah
def test_an_archive_of_the_same_inputs_is_copied_not_built_again(archive: Archive,
                                                                 tmp_path: Path) -> None:
    """Another checkout of the same tree (a clone's own archive, as the add-on e2e writes
    it) gets a copy of the cache's archive: no second buildah build of the same image."""
    out = tmp_path / "other-checkout.oci.tar"
    r = subprocess.run(["bash", str(BUILD), "-o", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "buildah bud" not in r.stdout, r.stdout
    m = re.search(r"^build-image: \[\d+s\] same inputs as (\S+): copied$", r.stdout, re.M)
    assert m, r.stdout
    src = Path(m.group(1))  # the module's archive, or another checkout's of this tree
    stamp = Path(f"{archive.path}.inputs").read_text()
    assert Path(f"{src}.inputs").read_text() == Path(f"{out}.inputs").read_text() == stamp
    assert out.read_bytes() == src.read_bytes()
    assert Path(f"{out}.sizes").read_text() == Path(f"{src}.sizes").read_text()


@pytest.fixture
def imported(archive: Archive, containerd: Any) -> Iterator[list[str]]:
    """``ctr`` for the harness's containerd with the image imported, as the harness
    loads it into every node; yields the command prefix for ``ctr run``."""
    ctr = ["ctr", "-a", containerd.address, "-n", "k8s.io"]
    r = subprocess.run([*ctr, "images", "import", "--snapshotter", containerd.snapshotter,
                        str(archive.path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    listed = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True)
    assert IMAGE in listed.stdout.split(), listed.stdout
    yield ctr
    subprocess.run([*ctr, "images", "rm", "--sync", IMAGE], capture_output=True, timeout=120)


def run_in_image(ctr: list[str], containerd: Any, *argv: str) -> subprocess.CompletedProcess[str]:
    cid = f"aggapi-image-{uuid.uuid4().hex[:8]}"
    # Under the harness's cgroup parent, so its teardown removes whatever is left.
    return subprocess.run(
        [*ctr, "run", "--rm", "--snapshotter", containerd.snapshotter,
         "--cgroup", f"{containerd.cgroup_parent}/{cid}", IMAGE, cid, *argv],
        capture_output=True, text=True, timeout=180)


def _flags(help_text: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]+", help_text))


@pytest.mark.slow
@pytest.mark.integration  # builds the image: root, mmdebstrap, buildah
def test_image_runs_under_containerd(imported: list[str], containerd: Any) -> None:
    r = run_in_image(imported, containerd, "aggapi", "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == aggapi.__version__
    r = run_in_image(imported, containerd, "aggapi", "apiserver", "--help")
    assert r.returncode == 0, r.stderr
    # The same flags as the apiserver in this checkout.
    here = subprocess.run([sys.executable, "-m", "aggapi", "apiserver", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "--secure-port" in r.stdout
    assert _flags(r.stdout) == _flags(here.stdout)
    # The agent imports grpcio, whose extension needs libstdc++ from the base.
    r = run_in_image(imported, containerd, "aggapi", "agent", "--help")
    assert r.returncode == 0, r.stderr
    assert "--cri-address" in r.stdout
    # The compiled copy loops load there (the line the agent logs at start), and the
    # agent's switch turns them off.
    which = "from aggapi.agent.copy import fastuntar; print(fastuntar.describe())"
    r = run_in_image(imported, containerd, "python3", "-c", which)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("tar uploads: compiled (aggapi.agent.copy._fastuntar); "
                                "tar walks: compiled (aggapi.agent.copy._fastwalk); "
                                "tar headers: compiled (aggapi.tar._fastheader)"), r.stdout
    r = run_in_image(imported, containerd, "env", "AGGAPI_PURE_PYTHON=1", "python3", "-c", which)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("tar uploads: python (AGGAPI_PURE_PYTHON is set); "
                                "tar walks: python (AGGAPI_PURE_PYTHON is set); "
                                "tar headers: python (AGGAPI_PURE_PYTHON is set)"), r.stdout
    # What the interpreter in the image can import: the server, not the harness or the
    # plugin-only packages; and it runs as the non-root default user.
    probe = ("import importlib.util as u, os, aggapi.apiserver.app, aggapi.agent; "
             "print(os.getuid(), [m for m in ('aggapi.testing', 'tests', 'rich', "
             "'kubernetes_asyncio') if u.find_spec(m)])")
    r = run_in_image(imported, containerd, "python3", "-c", probe)
    assert r.returncode == 0, r.stderr
    uid, found = r.stdout.split(" ", 1)
    assert uid == "65532"
    core = _core_dependencies()
    expected = [m for d, m in PLUGIN_PACKAGES.items() if d in core]
    assert found.strip() == repr(expected)


def _docker_context(dest: Path) -> None:
    """The build context docker sees in a plain checkout (what .dockerignore lets in):
    pyproject.toml, README.md, aggapi/ without bytecode or the test harness; no wheels/."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "aggapi", dest / "aggapi",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "testing"))


@pytest.mark.slow
def test_build_stage_without_wheelhouse_installs_from_the_index(tmp_path: Path) -> None:
    """docker build from a plain checkout: no wheels/ in the context, so the build stage's
    RUN steps install from the package index. Run here as /bin/sh runs them in the image,
    in a fresh virtualenv (hack/build-image.sh always has a wheelhouse, so the image
    tests above do not take this branch)."""
    build = _stages()["build"]
    assert ("COPY", ". ./") in build
    src = tmp_path / "src"
    _docker_context(src)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    for ins, args in build:
        if ins == "ENV":
            for m in re.finditer(r"(\w+)=(\S+)", args):
                env[m.group(1)] = m.group(2)
    env["VENV"] = str(tmp_path / "venv")  # /opt/aggapi in the image
    # `python3` in the image is the base image's interpreter: here, the one running pytest.
    pybin = tmp_path / "pybin"
    pybin.mkdir()
    (pybin / "python3").symlink_to(sys.executable)
    env["PATH"] = f"{pybin}{os.pathsep}{env.get('PATH', '')}"
    runs = [a for i, a in build if i == "RUN"]
    assert runs
    for cmd in runs:
        r = subprocess.run(["/bin/sh", "-c", cmd], cwd=src, env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"RUN {cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = subprocess.run([str(tmp_path / "venv/bin/aggapi"), "--version"], capture_output=True,
                         text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip() == aggapi.__version__
    # Both entry points import from the installed copy, not from the source tree.
    for sub in ("apiserver", "agent"):
        r = subprocess.run([str(tmp_path / "venv/bin/aggapi"), sub, "--help"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={"PATH": "/usr/bin:/bin"}, timeout=120)
        assert r.returncode == 0, f"aggapi {sub} --help:\n{r.stderr[-2000:]}"
    site = next((tmp_path / "venv/lib").glob("python3.*/site-packages"))
    assert not (site / "aggapi/testing").exists()
    assert not {"pip", "setuptools"} & {p.name for p in site.iterdir()}
