"""``bench_kubectl_cp --installed``: the cluster, found running or brought up and taken
down again, and the chart variants (``--variant``) with their images."""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.framework.addon import IMAGE_ARCHIVE, IMAGE_REPOSITORY, Addon, addon_of
from tests.framework.cluster import Cluster, registry_of
from tests.framework.controlplane import ControlPlane
from tests.framework.repo import REPO


def image_archive(suite: str | None = None) -> Path:
    """This checkout's image in an archive of its own (as tests/e2e/addon does), one per
    Debian suite when one is named."""
    tag = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
    return IMAGE_ARCHIVE.with_name(f"aggapi-{tag}{f'-{suite}' if suite else ''}.oci.tar")


def suite_image(addon: Addon, suite: str, root: Path = REPO) -> tuple[str, list[str]]:
    """The image of checkout ``root`` on Debian ``suite``, built (hack/build-image.sh
    skips an unchanged one) and imported into every node; its name and the helm values
    that run it in place of the installed one."""
    own = "" if root == REPO else "-" + hashlib.sha256(str(root).encode()).hexdigest()[:8]
    tag = f"dev-{suite}{own}"
    image = f"{IMAGE_REPOSITORY}:{tag}"
    archive = image_archive(suite + own)
    subprocess.run(["bash", str(root / "hack/build-image.sh"), "--suite", suite, "-t", image,
                    "-o", str(archive)], check=True, stdout=subprocess.DEVNULL)
    addon.load_image(archive)
    return image, [f"image.repository={IMAGE_REPOSITORY}", f"image.tag={tag}",
                   "image.digest=", "image.pullPolicy=Never"]


@contextlib.contextmanager
def installed(instance: str, up: bool) -> Iterator[tuple[Cluster, Addon]]:
    cp = ControlPlane(instance=instance)
    started_cp = started_nodes = installed_here = False
    try:
        if not cp.proc("kube-apiserver").alive():
            if not up:
                raise SystemExit(f"no control plane {instance!r}: run hack/local-up.sh "
                                 "or pass --up")
            cp.up()
            started_cp = True
        cluster = Cluster(cp, registry_of(cp))
        if not all(n.proc("kubelet").alive() for n in cluster.nodes):
            if not up:
                raise SystemExit("the two-node cluster is not up: hack/local-up.sh or --up")
            cluster.up()
            started_nodes = True
        addon = addon_of(cluster)
        if not addon.installed():
            if not up:
                raise SystemExit("aggapi is not installed: hack/local-up.sh or --up")
            archive = image_archive()
            subprocess.run(["bash", str(REPO / "hack/build-image.sh"), "-o", str(archive)],
                           check=True, stdout=subprocess.DEVNULL)
            addon.load_image(archive)
            addon.remove_harness_objects()
            installed_here = True
            print(f"bench: {addon.install().line()}", file=sys.stderr, flush=True)
        yield cluster, addon
    finally:
        if started_cp:
            cp.down()  # the nodes with it
        elif started_nodes:
            cluster.down()
        elif installed_here:
            addon.uninstall()




@dataclass(frozen=True)
class Variant:
    label: str
    sets: tuple[str, ...]  # helm --set values
    ncp_root: Path = REPO  # where the ncp client runs from (a checkout's root)
    suite: str | None = None  # the pods' image built on this Debian suite; None: as is
    src: Path = REPO  # the checkout the pods' image is built from (with suite)


def parse_variant(text: str) -> Variant:
    """``LABEL=K=V,...``: helm ``--set`` values; ``ncp=DIR``: the ncp client run from
    DIR (a checkout's root holding ``aggapi/``) instead of this one; ``suite=SUITE``: the
    pods run this checkout's image built on Debian SUITE; ``src=DIR`` (with ``suite=``):
    that image built from checkout DIR instead. The last of each wins."""
    label, _, spec = text.partition("=")
    sets, own = [], {}
    for s in (s for s in spec.split(",") if s):
        key, _, value = s.partition("=")
        if key in ("ncp", "suite", "src"):
            own[key] = value
        else:
            sets.append(s)
    if "src" in own and not own.get("suite"):
        raise SystemExit(f"variant {label!r}: src= needs suite= (the image to build)")
    return Variant(label, tuple(sets), Path(own["ncp"]).resolve() if "ncp" in own else REPO,
                   own.get("suite") or None,
                   Path(own["src"]).resolve() if "src" in own else REPO)
