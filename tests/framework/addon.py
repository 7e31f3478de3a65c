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
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.framework.cluster import Cluster
from tests.framework.controlplane import APISERVICE, GROUP, VERSION, ControlPlane, binary
from tests.framework.kubelet import forget_images, pod_manifest
from tests.framework.node import Node
from tests.framework.procs import HarnessError
from tests.framework.release import RegistryLogin, Release, publish, verify_release
from tests.framework.repo import REPO

CHART = REPO / "manifests/charts/aggapi"
IMAGE_ARCHIVE = Path(os.environ.get("AGGAPI_IMAGE_CACHE", "/var/cache/aggapi-image")) \
    / "aggapi-dev.oci.tar"
# This checkout's image, in an archive of its own: the default one is shared by every
# checkout on the machine, and another branch's build may replace it at any time.
CHECKOUT_ARCHIVE = IMAGE_ARCHIVE.with_name(
    f"aggapi-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}.oci.tar")
IMAGE_REPOSITORY = "localhost/aggapi"
IMAGE_TAG = "dev"
PSA = "pod-security.kubernetes.io"
PULL_SECRET = "aggapi-registry"


def log(msg: str) -> None:
    print(f"addon: {msg}", file=sys.stderr, flush=True)


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


@dataclass(frozen=True)
class InstallTimes:
    """Seconds from the start of ``helm install`` (helm returns before pods run)."""

    helm: float
    available: float
    ready: float

    def line(self) -> str:
        return (f"helm install {self.helm:.1f}s, APIService Available after "
                f"{self.available:.1f}s, all pods Ready after {self.ready:.1f}s")


def wait_for(ok: Callable[[], Any], timeout: float, what: str, *,
             detail: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = ok()
        if v:
            return v
        if time.monotonic() > deadline:
            raise HarnessError(f"{what}: not within {timeout:.0f}s. {detail()}")
        time.sleep(0.25)


@dataclass
class Addon:
    """One helm release of the chart on the cluster of ``cp`` with nodes ``nodes``."""

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

    # --- state -----------------------------------------------------------------------------
    @property
    def fullname(self) -> str:
        return self.release if "aggapi" in self.release else f"{self.release}-aggapi"

    @property
    def agent_name(self) -> str:
        return f"{self.fullname}-agent"

    def pods(self, component: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get_json(
            "pods", "-n", self.namespace,
            f"-l=app.kubernetes.io/instance={self.release},"
            f"app.kubernetes.io/component={component}")["items"]
        return items

    @staticmethod
    def ready(pod: Mapping[str, Any]) -> bool:
        if pod["metadata"].get("deletionTimestamp"):
            return False
        conds = (pod.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def apiserver_pods(self) -> list[dict[str, Any]]:
        return self.pods("apiserver")

    def agent_pod(self, node: str) -> dict[str, Any]:
        for p in self.pods("agent"):
            if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp"):
                return p
        raise HarnessError(f"no agent pod on {node}")

    def node_names(self) -> list[str]:
        """The nodes the add-on runs on (the cluster's, not a stand-in's)."""
        return [n.name for n in self.nodes]

    def available(self) -> bool:
        """Available=True, served through the chart's Service, and discovery answers."""
        r = self.kubectl("get", "apiservice", APISERVICE, "-o", "json", check=False)
        if r.returncode != 0:
            return False
        svc = json.loads(r.stdout)["spec"].get("service") or {}
        if svc.get("namespace") != self.namespace or svc.get("name") != self.fullname:
            return False
        return self.cp.apiservice_available()

    def _ready_state(self) -> str | None:
        """None when everything is Ready, else what is not yet."""
        dep = self.get_json("deployment", "-n", self.namespace, self.fullname)
        want = dep["spec"]["replicas"]
        st = dep.get("status") or {}
        if st.get("observedGeneration") != dep["metadata"]["generation"]:
            return "deployment change not yet observed"
        if (st.get("readyReplicas") or 0) != want or (st.get("updatedReplicas") or 0) != want \
                or (st.get("replicas") or 0) != want:
            return f"deployment {st.get('readyReplicas') or 0}/{want} ready"
        ready = [p for p in self.apiserver_pods() if self.ready(p)]
        nodes = self.node_names()
        spread = {p["spec"]["nodeName"] for p in ready}
        if len(spread) < min(want, len(nodes)):
            return f"apiserver pods not spread: {sorted(spread)}"
        ds = self.get_json("daemonset", "-n", self.namespace, self.agent_name)
        ds_st = ds.get("status") or {}
        if ds_st.get("observedGeneration") != ds["metadata"]["generation"]:
            return "daemonset change not yet observed"
        agents = {p["spec"].get("nodeName") for p in self.pods("agent") if self.ready(p)}
        if ds_st.get("numberReady") != len(nodes) or agents != set(nodes) \
                or ds_st.get("updatedNumberScheduled") != len(nodes):
            return f"agents ready on {sorted(a for a in agents if a)} of {nodes}"
        gone = [p["metadata"]["name"] for c in ("apiserver", "agent") for p in self.pods(c)
                if p["metadata"].get("deletionTimestamp")]
        if gone:
            return f"pods still terminating: {gone}"
        return None

    def wait_ready(self, *, timeout: float = 300) -> None:
        state: list[str | None] = [None]

        def ok() -> bool:
            state[0] = self._ready_state()
            return state[0] is None

        wait_for(ok, timeout, "aggapi pods Ready", detail=lambda: f"{state[0]}; {self.diagnose()}")

    def describe(self) -> str:
        """Pods and their node, for failure messages and hack/local-up.sh."""
        r = self.kubectl("-n", self.namespace, "get", "pods", "-o", "wide", check=False)
        return r.stdout + r.stderr

    def logs(self, pod: str, *, previous: bool = False, tail: int = 30) -> str:
        r = self.kubectl("-n", self.namespace, "logs", pod, f"--tail={tail}",
                         *(["--previous"] if previous else []), check=False)
        return r.stdout + r.stderr

    def diagnose(self) -> str:
        """Pods, then the logs of every pod that is not Ready (for failure messages)."""
        out = [self.describe()]
        for comp in ("apiserver", "agent"):
            for p in self.pods(comp):
                if not self.ready(p) and p["spec"].get("nodeName"):
                    name = p["metadata"]["name"]
                    restarted = any(c.get("restartCount") for c in
                                    (p.get("status") or {}).get("containerStatuses") or [])
                    out.append(f"--- {name}:\n{self.logs(name, previous=restarted)}")
        return "\n".join(out)

    def group_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}"


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
