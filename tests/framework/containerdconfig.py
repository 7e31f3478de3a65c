"""Which containerd the harness runs, where its binaries are, and its config file.

Two flavours, chosen by environment variables so every fixture and the node harness
follow one switch:

- ``AGGAPI_CONTAINERD=2.x`` (the default, as new clusters run it): containerd 2.x built
  from its Go module by
  ``hack/build-binaries.sh containerd`` (version in hack/tools/versions.env), config
  version 3 (``io.containerd.cri.v1.images`` / ``io.containerd.cri.v1.runtime``).
  ``AGGAPI_CONTAINERD_PULL=transfer`` (the default, as upstream's since 2.1) lets CRI pull
  through the transfer service; ``local`` sets ``use_local_image_pull = true`` (CRI pulls
  with the client library, as 1.6 does).
- ``AGGAPI_CONTAINERD=1.6``: Debian's containerd 1.6, config version 2 (CRI settings under
  ``io.containerd.grpc.v1.cri``).

Registries: the harness's registry and throttle proxy are plain-HTTP hosts described in
``hosts.toml`` files under one directory. 1.6 and 2.x's local pull read it from the CRI
plugin's ``registry.config_path``. Under the transfer service, containerd 2.4 passes the
CRI plugin's ``config_path`` along with each pull request; releases around 2.1 took host
configuration from the transfer plugin's own ``config_path`` instead. Both are set to
the same directory, so either way the harness's hosts are used.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.framework import kubetools
from tests.framework.procs import HarnessError

ENV_VERSION = "AGGAPI_CONTAINERD"
ENV_PULL = "AGGAPI_CONTAINERD_PULL"
V1_6, V2 = "1.6", "2.x"
TRANSFER, LOCAL = "transfer", "local"

DEBIAN_CONTAINERD = "/usr/bin/containerd"
DEBIAN_RUNC = "/usr/sbin/runc"
SHIM = "containerd-shim-runc-v2"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())

# Plugins that cannot work here (or would touch host-global paths) are left out. NRI
# (on by default in 2.x) listens on the fixed /var/run/nri/nri.sock, which two
# containerds on one machine would share.
_DISABLED_COMMON = (
    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)
_DISABLED = {
    V1_6: ("io.containerd.snapshotter.v1.aufs", *_DISABLED_COMMON),
    V2: (*_DISABLED_COMMON, "io.containerd.snapshotter.v1.erofs",
         "io.containerd.snapshotter.v1.blockfile", "io.containerd.nri.v1.nri"),
}


@dataclass(frozen=True)
class Flavor:
    """One containerd set-up: its major line and, on 2.x, how CRI pulls."""

    version: str = V2  # V2 | V1_6
    pull: str = TRANSFER  # TRANSFER | LOCAL; 1.6 only has the local (client) pull

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Flavor:
        version = environ.get(ENV_VERSION, V2).strip() or V2
        if version in ("2", "2.x", "v2"):
            version = V2
        if version not in (V1_6, V2):
            raise HarnessError(f"{ENV_VERSION}={version!r}: expected {V1_6!r} or {V2!r}")
        pull = environ.get(ENV_PULL, "").strip() or (TRANSFER if version == V2 else LOCAL)
        if pull not in (TRANSFER, LOCAL):
            raise HarnessError(f"{ENV_PULL}={pull!r}: expected {TRANSFER!r} or {LOCAL!r}")
        if version == V1_6 and pull != LOCAL:
            raise HarnessError(f"containerd 1.6 has no transfer-service pull ({ENV_PULL})")
        return cls(version, pull)

    def version_prefix(self) -> str:
        """How the version this flavour's containerd reports (CRI and its own API) starts."""
        return "1.6." if self.version == V1_6 else pinned_version()

    @property
    def label(self) -> str:
        return "containerd 1.6" if self.version == V1_6 else f"containerd 2.x ({self.pull} pull)"


def pinned_version() -> str:
    """CONTAINERD_VERSION from hack/tools/versions.env (the 2.x build)."""
    ver = kubetools.versions().get("CONTAINERD_VERSION")
    if not ver:
        raise HarnessError("CONTAINERD_VERSION missing from hack/tools/versions.env")
    return ver


@dataclass(frozen=True)
class Binaries:
    containerd: str
    runc: str
    shim: str  # containerd-shim-runc-v2 of the same release as containerd


def binaries(flavor: Flavor, *, build: bool = True) -> Binaries:
    """The binaries of ``flavor``; 2.x comes from hack/build-binaries.sh's cache (built
    there first if missing and ``build``: a fresh machine has none, and its tests must
    not skip)."""
    if flavor.version == V1_6:
        return Binaries(DEBIAN_CONTAINERD, DEBIAN_RUNC, "/usr/bin/" + SHIM)
    ver = pinned_version()
    cache = kubetools.bin_cache()
    ctd, shim = cache / f"containerd-{ver}", cache / f"{SHIM}-{ver}"
    if build and not (ctd.exists() and shim.exists()):
        kubetools.build_binaries("containerd")
    for b in (ctd, shim):
        if not b.exists():
            raise HarnessError(f"{b} missing: run `bash hack/build-binaries.sh containerd`")
    # Debian's runc (1.1) serves both: containerd 2.x only needs the OCI runtime CLI.
    return Binaries(str(ctd), DEBIAN_RUNC, str(shim))


@dataclass(frozen=True)
class Settings:
    """Everything of one containerd's config that is not flavour-specific."""

    root: Path
    state: Path
    address: str
    hosts_dir: Path
    cni_conf_dir: Path
    sandbox_image: str
    snapshotter: str
    runc: str


def config_text(flavor: Flavor, s: Settings) -> str:
    """The config.toml of ``flavor`` for ``s``."""
    return (_v2_config if flavor.version == V1_6 else _v3_config)(flavor, s)


def _head(version: int, flavor: Flavor, s: Settings) -> str:
    disabled = ", ".join(f'"{p}"' for p in _DISABLED[flavor.version])
    return f"""version = {version}
root = "{s.root}"
state = "{s.state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{s.address}"
[ttrpc]
  address = "{s.address}.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.internal.v1.opt"]
  path = "{s.root}/opt"
"""


def _v2_config(flavor: Flavor, s: Settings) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return _head(2, flavor, s) + f"""[{cri}]
  sandbox_image = "{s.sandbox_image}"
  # This VM lacks CAP_SYS_RESOURCE: never lower oom_score_adj below ours.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "{s.snapshotter}"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{s.runc}"
  Root = "{s.state}/runc"
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{s.cni_conf_dir}"
[{cri}.registry]
  config_path = "{s.hosts_dir}"
"""


def _v3_config(flavor: Flavor, s: Settings) -> str:
    images = "plugins.'io.containerd.cri.v1.images'"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    transfer = "plugins.'io.containerd.transfer.v1.local'"
    local = "true" if flavor.pull == LOCAL else "false"
    return _head(3, flavor, s) + f"""[{images}]
  snapshotter = "{s.snapshotter}"
  use_local_image_pull = {local}
[{images}.pinned_images]
  sandbox = "{s.sandbox_image}"
[{images}.registry]
  config_path = "{s.hosts_dir}"
[{runtime}]
  # This VM lacks CAP_SYS_RESOURCE: never lower oom_score_adj below ours.
  restrict_oom_score_adj = true
  enable_selinux = false
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{s.runc}"
  Root = "{s.state}/runc"
[{runtime}.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "{s.cni_conf_dir}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
# The transfer service's own registry host directory (see the module docstring), and
# its unpack target: it only unpacks for a (platform, snapshotter) listed here, and the
# default lists overlayfs alone (the harness falls back to native where overlay fails).
[{transfer}]
  config_path = "{s.hosts_dir}"
[[{transfer}.unpack_config]]
  platform = "linux/{ARCH}"
  snapshotter = "{s.snapshotter}"
  differ = "walking"
"""
