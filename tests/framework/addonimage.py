"""aggapi's image for the add-on: the archive hack/build-image.sh writes, and the nodes'
containerd it is imported into."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.framework.procs import HarnessError
from tests.framework.repo import REPO

IMAGE_ARCHIVE = Path(os.environ.get("AGGAPI_IMAGE_CACHE", "/var/cache/aggapi-image")) \
    / "aggapi-dev.oci.tar"
# This checkout's image, in an archive of its own: the default one is shared by every
# checkout on the machine, and another branch's build may replace it at any time.
CHECKOUT_ARCHIVE = IMAGE_ARCHIVE.with_name(
    f"aggapi-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}.oci.tar")
IMAGE_REPOSITORY = "localhost/aggapi"
IMAGE_TAG = "dev"


def build_image(archive: Path = CHECKOUT_ARCHIVE) -> float:
    """hack/build-image.sh into ``archive`` (no work when its inputs are unchanged);
    the seconds it took."""
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "hack/build-image.sh"), "-o", str(archive)], check=True,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


@dataclass(frozen=True)
class NodeRuntime:
    """One node's containerd as seen from this host: ``ctr`` runs with ``prefix`` (e.g. an
    nsenter into the node's namespaces) against ``socket``."""

    name: str
    socket: str
    prefix: tuple[str, ...] = ()

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [*self.prefix, "ctr", f"--address={self.socket}", "--namespace=k8s.io", *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise HarnessError(f"{' '.join(argv)}: {r.stderr.strip()}")
        return r

