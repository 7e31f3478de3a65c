"""One helm release of the chart: its settings (tests.framework.addon.Addon's fields) and
the helm and kubectl commands run for it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.framework.addonimage import IMAGE_TAG, NodeRuntime
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.procs import HarnessError
from tests.framework.release import RegistryLogin, Release

PSA = "pod-security.kubernetes.io"


@dataclass(frozen=True)
class InstallTimes:
    """Seconds from the start of ``helm install`` (helm returns before pods run)."""

    helm: float
    available: float
    ready: float

    def line(self) -> str:
        return (f"helm install {self.helm:.1f}s, APIService Available after "
                f"{self.available:.1f}s, all pods Ready after {self.ready:.1f}s")


@dataclass
class AddonBase:
    """The settings of a release (tests.framework.addon.Addon) and its commands."""

    cp: ControlPlane
    nodes: Sequence[NodeRuntime]
    release: str = "aggapi"
    namespace: str = "aggapi"
    # A local tag of the imported image (imagePullPolicy Never); None: the published
    # release's image, by digest, pulled from its registry.
    image_tag: str | None = IMAGE_TAG
    # Extra ``--set`` values (e.g. hostNetwork for a cluster without pod routes).
    values: list[str] = field(default_factory=list)
    # Extra ``--set-string`` values (e.g. environment variables that look like numbers).
    string_values: list[str] = field(default_factory=list)
    # Labels put on the namespace before install (Pod Security); None: none.
    namespace_labels: Mapping[str, str] | None = field(
        default_factory=lambda: {f"{PSA}/enforce": "privileged"})
    install_times: InstallTimes | None = None
    # Imports the archive into every node (e.g. tests.framework.cluster's); None: ``ctr
    # images import`` on each of ``nodes``.
    importer: Callable[[Path], float] | None = None
    # Installs come from this release (hack/release.sh) when set, pulled with ``login``.
    published: Release | None = None
    login: RegistryLogin | None = None

    # --- commands --------------------------------------------------------------------------
    def helm(self, *args: str, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [binary("helm"), f"--kubeconfig={self.cp.admin_kubeconfig}", *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise HarnessError(f"helm {' '.join(args)}: {r.stdout}\n{r.stderr}")
        return r

    def kubectl(self, *args: str, check: bool = True,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cp.kubectl(*args, check=check, input=input)

    def get_json(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.kubectl("get", "-o", "json", *args).stdout)
        return out
