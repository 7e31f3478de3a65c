"""aggapi installed as a user installs it: a signed release from a registry, ``helm install``.

The harness's own aggapi objects (host processes behind hand-made Services and
EndpointSlices, the shipped RBAC applied with kubectl) are removed first, so what serves
the APIService afterwards is only what the chart created: the apiserver Deployment behind
the chart's Service, the agent DaemonSet behind its headless Service, the EndpointSlices
kube-controller-manager makes for them, the aggregated ClusterRoles it fills in.

    publish      hack/release.sh into the harness's htpasswd registry: the image by
                 digest, the chart as an OCI artifact, SBOM, cosign signatures
    install      with a release (``Addon.release``): ``cosign verify`` of image and chart
                 (nothing is installed from a reference it refuses), ``helm registry
                 login``, a dockerconfigjson pull Secret, then ``helm install aggapi
                 oci://REGISTRY/charts/aggapi@sha256:...`` (the chart by the digest cosign
                 verified) with the image by digest and
                 the default pull policy: each node pulls it through the Secret. Without
                 one: ``helm install`` of manifests/charts/aggapi, the image imported.
                 Waits until the Deployment's replicas are Ready (one per node when there
                 are enough nodes), one Ready agent per node and the APIService Available;
                 returns the seconds from helm install to each
    load_image   ``ctr -n k8s.io images import`` of hack/build-image.sh's OCI archive on
                 every node's containerd (the archive carries the name localhost/aggapi:dev):
                 the harness's own pods run it as a sleeper, and tests roll to local tags
    uninstall    ``helm uninstall`` and the namespace

CLI (hack/local-up.sh, after ``python3 -m tests.framework.cluster up``):
``python3 -m tests.framework.addon install|uninstall|status|demo [--instance local]``
(demo: a pod on the last node pulls a throttled image, its progress followed live).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.framework.addonbase import PSA, AddonBase, InstallTimes  # noqa: F401
from tests.framework.addonimage import (  # noqa: F401
    CHECKOUT_ARCHIVE,
    IMAGE_ARCHIVE,
    IMAGE_REPOSITORY,
    IMAGE_TAG,
    NodeRuntime,
    build_image,
)
from tests.framework.addonstate import AddonState, wait_for
from tests.framework.cluster import Cluster
from tests.framework.controlplane import APISERVICE, GROUP, VERSION, ControlPlane, binary
from tests.framework.kubelet import forget_images, pod_manifest
from tests.framework.node import Node
from tests.framework.procs import HarnessError
from tests.framework.release import RegistryLogin, Release, publish, verify_release
from tests.framework.repo import REPO

CHART = REPO / "manifests/charts/aggapi"
PULL_SECRET = "aggapi-registry"


def log(msg: str) -> None:
    print(f"addon: {msg}", file=sys.stderr, flush=True)


# The fields and the helm/kubectl commands are AddonBase's (addonbase.py), the pods and
# their readiness AddonState's (addonstate.py).
class Addon(AddonState):
    """One helm release of the chart on the cluster of ``cp`` with nodes ``nodes``."""

    # --- the image -------------------------------------------------------------------------
    @property
    def image_repository(self) -> str:
        """The release's repository in its registry, else the imported localhost/aggapi."""
        return self.published.image.split("@")[0] if self.published else IMAGE_REPOSITORY

    @property
    def image(self) -> str:
        if self.image_tag is None:
            if self.published is None:
                raise HarnessError("image_tag None needs a published release")
            return self.published.image
        return f"{self.image_repository}:{self.image_tag}"

    def load_image(self, archive: Path = IMAGE_ARCHIVE) -> float:
        """Import the image archive into every node's containerd; the seconds it took."""
        if not archive.exists():
            raise HarnessError(f"{archive} missing: run hack/build-image.sh")
        if self.importer is not None:
            return self.importer(archive)
        t0 = time.monotonic()
        for n in self.nodes:
            n.ctr("images", "import", "--no-unpack", str(archive))
        return time.monotonic() - t0

    def tag_image(self, tag: str) -> None:
        """The image under another tag (same content, new name): in the release's registry
        (kubelet lets a pod use an image pulled with credentials only with credentials
        for its own name: a local tag of it would be ErrImageNeverPull), else on every
        node."""
        if self.published is not None:
            subprocess.run(["skopeo", "copy", "--quiet", "--preserve-digests",
                            "--authfile", str(self.published.auth_dir / "config.json"),
                            "--src-tls-verify=false", "--dest-tls-verify=false",
                            f"docker://{self.published.image}",
                            f"docker://{self.image_repository}:{tag}"],
                           check=True, timeout=120, capture_output=True)
            return
        for n in self.nodes:
            n.ctr("images", "tag", "--force", self.image, f"{IMAGE_REPOSITORY}:{tag}")

    # --- install ---------------------------------------------------------------------------
    def set_args(self, extra: Sequence[str] = ()) -> list[str]:
        # The pull Secret stays whatever image runs, as a user's values keep it.
        image = [f"imagePullSecrets[0].name={PULL_SECRET}"] if self.login else []
        if self.image_tag is not None:  # else the chart's own image (by digest), pull policy
            policy = "IfNotPresent" if self.published else "Never"
            image += [f"image.repository={self.image_repository}", f"image.tag={self.image_tag}",
                      "image.digest=", f"image.pullPolicy={policy}"]
        sets = [*image, *self.values, *extra]
        return [*(a for v in sets for a in ("--set", v)),
                *(a for v in self.string_values for a in ("--set-string", v))]

    # --- the release -----------------------------------------------------------------------
    @property
    def registry_config(self) -> Path:
        """helm's registry login of this harness (not the invoking user's ~/.config/helm)."""
        return self.cp.state / "helm" / "registry.json"

    def chart_args(self) -> list[str]:
        """The chart argument(s) of helm install/upgrade: the release's OCI chart by the
        digest cosign verified (a tag moved after the verification changes nothing),
        else the checkout's chart directory."""
        if self.published is None:
            return [str(CHART)]
        return [f"oci://{self.published.chart_by_digest}", "--plain-http",
                "--registry-config", str(self.registry_config)]

    def publish(self, archive: Path, login: RegistryLogin) -> Release:
        """hack/release.sh of ``archive`` to ``login``'s registry; later installs use it."""
        self.published = publish(login, archive, self.cp.state / "release")
        self.login = login
        self.image_tag = None
        return self.published

    def prepare_release(self) -> None:
        """Before helm install: verify image and chart signatures (raises
        VerificationError before anything is made), the namespace, helm's registry
        login, the pull Secret."""
        if self.published is not None:
            verify_release(self.published)
        if self.namespace_labels or (self.published and self.login):
            self.create_namespace()  # labelled before any pod is admitted; the Secret's
        if self.published is not None and self.login is not None:
            self.login.helm_login(self.registry_config)
            self.kubectl("apply", "-f", "-", input=json.dumps(
                self.login.pull_secret(PULL_SECRET, self.namespace)))

    def remove_harness_objects(self) -> None:
        """What the harness's bootstrap made for its host-process aggapi: the APIService,
        its namespace (Services, EndpointSlices, ServiceAccounts) and the shipped RBAC."""
        self.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found")
        for f in self.cp.rbac_files():
            if f.is_relative_to(REPO / "manifests"):
                self.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(f))
        # Pods the host-process harness bound to nodes whose kubelet has stopped would
        # never finish terminating and hold the namespace: remove them outright.
        self.kubectl("delete", "pods", "--all", "-n", self.namespace, "--force",
                     "--grace-period=0", "--ignore-not-found", "--wait=false", check=False)
        r = self.kubectl("delete", "namespace", self.namespace, "--ignore-not-found",
                         "--timeout=90s", check=False)  # within kubectl()'s own 120 s
        if r.returncode != 0:
            status = self.kubectl("get", "namespace", self.namespace, "-o",
                                  "jsonpath={.status}", check=False)
            raise HarnessError(f"namespace {self.namespace} not deleted: {r.stderr} "
                               f"{status.stdout}")

    def create_namespace(self) -> None:
        if self.kubectl("get", "namespace", self.namespace, check=False).returncode != 0:
            self.kubectl("create", "namespace", self.namespace)
        if self.namespace_labels:
            self.kubectl("label", "--overwrite", "namespace", self.namespace,
                         *(f"{k}={v}" for k, v in self.namespace_labels.items()))

    def install(self, extra: Sequence[str] = (), *, timeout: float = 180) -> InstallTimes:
        """``helm install`` as the README says, then wait until everything serves."""
        self.prepare_release()
        t0 = time.monotonic()
        self.helm("install", self.release, *self.chart_args(), "-n", self.namespace,
                  "--create-namespace", *self.set_args(extra))
        helm_s = time.monotonic() - t0
        wait_for(self.available, timeout, "APIService Available", detail=self.diagnose)
        available_s = time.monotonic() - t0
        self.wait_ready(timeout=timeout)
        self.install_times = InstallTimes(helm_s, available_s, time.monotonic() - t0)
        return self.install_times

    def upgrade(self, extra: Sequence[str] = (), *, image_tag: str | None = "") -> None:
        """helm upgrade; ``image_tag`` another local tag, None the release's image, ""
        (default) the image as it is."""
        if image_tag != "":
            self.image_tag = image_tag
        self.prepare_release()
        self.helm("upgrade", self.release, *self.chart_args(), "-n", self.namespace,
                  *self.set_args(extra))

    def uninstall(self, *, timeout: float = 120) -> None:
        self.helm("uninstall", self.release, "-n", self.namespace, "--wait",
                  f"--timeout={int(timeout)}s", check=False)
        self.kubectl("delete", "namespace", self.namespace, "--ignore-not-found",
                     f"--timeout={int(timeout)}s", check=False)

    def installed(self) -> bool:
        r = self.helm("status", self.release, "-n", self.namespace, check=False)
        return r.returncode == 0


def addon_of(cluster: Cluster) -> Addon:
    """The release on ``cluster``'s nodes (tests.framework.cluster), image imported by it."""
    nodes = [NodeRuntime(n.name, n.cri_address) for n in cluster.nodes]
    return Addon(cluster.cp, nodes, importer=cluster.import_image)


def release_registry(cluster: Cluster) -> RegistryLogin:
    """The cluster's htpasswd registry (tests.framework.node) and its user."""
    info = cluster.registry.info
    if not info.auth_registry_host:
        raise HarnessError("the registry node has no htpasswd registry: restart the cluster "
                           "(python3 -m tests.framework.cluster up)")
    return RegistryLogin(info.auth_registry_host, info.auth_registry_user,
                         info.auth_registry_password)


def running_cluster(instance: str) -> Cluster:
    """The cluster hack/local-up.sh (``python3 -m tests.framework.cluster up``) left up."""
    cp = ControlPlane(instance=instance)
    if not cp.proc("kube-apiserver").alive():
        raise HarnessError(f"no control plane {instance!r}: run hack/local-up.sh")
    return Cluster(cp, Node.load(cp))


DEMO_POD = "pull-demo"


def demo(cluster: Cluster, seconds: float = 20.0) -> None:
    """Pod ``pull-demo`` pinned to the last node, pulling the registry's ~150 MB image
    through the throttle in about ``seconds``; its progress printed live from the /watch/
    path (kubectl get --raw), as a user would follow it."""
    cp, reg, node = cluster.cp, cluster.registry, cluster.nodes[-1]
    cp.kubectl("delete", "pod", DEMO_POD, "--grace-period=0", "--force", "--ignore-not-found",
               "--wait=true", check=False)
    asyncio.run(forget_images(node.cri_address, reg.images.big))
    reg.set_rate(sum(size for _, size in reg.images.big_layers) / seconds)
    cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest(
        DEMO_POD, [{"name": "app", "image": reg.via_throttle(reg.images.big)}],
        node=node.name)))
    path = (f"/apis/{GROUP}/{VERSION}/watch/namespaces/default/pods/{DEMO_POD}/"
            f"imagepullprogress?granularity=image")
    log(f"pod {DEMO_POD} on {node.name}: kubectl get --raw '{path}'")
    try:
        subprocess.run([binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}", "get",
                        "--raw", path], check=False, timeout=seconds * 6)
    finally:
        reg.set_rate(None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tests.framework.addon",
                                 description="helm install / uninstall aggapi on the running "
                                             "two-node cluster (hack/local-up.sh)")
    ap.add_argument("command", choices=["install", "uninstall", "status", "demo"])
    ap.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"))
    args = ap.parse_args(argv)
    cluster = running_cluster(args.instance)
    addon = addon_of(cluster)
    if args.command == "demo":
        demo(cluster)
        return 0
    if args.command == "install":
        t0 = time.monotonic()
        rel = addon.publish(IMAGE_ARCHIVE, release_registry(cluster))
        log(f"hack/release.sh in {time.monotonic() - t0:.1f}s: chart {rel.chart} --version "
            f"{rel.chart_version}, image {rel.image}")
        if addon.installed():
            # Re-run: upgrade in place (a rebuilt image has another digest: new pods).
            addon.upgrade()
            addon.wait_ready()
            log("already installed: helm upgrade, Ready")
        else:
            addon.remove_harness_objects()
            log(addon.install().line())
    elif args.command == "uninstall":
        addon.uninstall()
    print(addon.describe(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
