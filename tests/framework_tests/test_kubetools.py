"""The Kubernetes release switch (AGGAPI_KUBE_VERSION) and its version table.

No cluster runs: binaries are only asked for ``--help``, so this needs no e2e lock.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.framework import controllers, kubetools
from tests.framework.controlplane import ControlPlane
from tests.framework.procs import HarnessError

PIN = kubetools.versions()["KUBE_VERSION"]


def test_default_is_the_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGGAPI_KUBE_VERSION", raising=False)
    assert kubetools.kube_version() == PIN
    monkeypatch.setenv("AGGAPI_KUBE_VERSION", "v1.36.3")
    assert kubetools.kube_version() == "v1.36.3"
    assert kubetools.kube_minor() == 36


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 99), st.integers(0, 99))
def test_minor_of_any_release(minor: int, patch: int) -> None:
    assert kubetools.kube_minor(f"v1.{minor}.{patch}") == minor
    assert kubetools.kube_minor(f"1.{minor}.{patch}") == minor


@pytest.mark.parametrize("bad", ["v2.1.0", "latest", "v1", "v1.x.3"])
def test_not_a_release(bad: str) -> None:
    with pytest.raises(HarnessError, match="not a Kubernetes release"):
        kubetools.kube_minor(bad)


def test_has_follows_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    for feature, since in kubetools.SINCE.items():
        assert kubetools.has(feature, f"v1.{since}.0")
        assert not kubetools.has(feature, f"v1.{since - 1}.9")
    monkeypatch.setenv("AGGAPI_KUBE_VERSION", "v1.30.4")
    assert "v1.30.4 lacks apiserver-requestheader-uid (since 1.32" in kubetools.lacks(
        "apiserver-requestheader-uid")


def test_other_release_uses_the_cache_not_the_links(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("AGGAPI_BIN_CACHE", str(tmp_path))
    monkeypatch.setenv("AGGAPI_KUBE_VERSION", "v1.99.1")
    monkeypatch.delenv("AGGAPI_KUBELET_BIN", raising=False)
    with pytest.raises(HarnessError, match=r"AGGAPI_KUBE_VERSION=v1\.99\.1 .*kubelet"):
        kubetools.binary("kubelet", build=False)
    (tmp_path / "kubelet-v1.99.1").write_text("")
    assert kubetools.binary("kubelet", build=False) == str(tmp_path / "kubelet-v1.99.1")
    # Tools outside k8s.io/kubernetes do not follow the release.
    monkeypatch.setenv("AGGAPI_HELM_BIN", "/x/helm")
    assert kubetools.binary("helm", build=False) == "/x/helm"


def test_the_pin_too_comes_from_the_cache(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    """A checkout's .local/bin links may name an older pin's build (the pin moved from
    v1.34.3 to v1.36.3): the pin's commands are taken from the cache by version."""
    monkeypatch.setenv("AGGAPI_BIN_CACHE", str(tmp_path))
    monkeypatch.delenv("AGGAPI_KUBE_VERSION", raising=False)
    monkeypatch.delenv("AGGAPI_KUBE_APISERVER_BIN", raising=False)
    with pytest.raises(HarnessError, match=f"kube-apiserver {PIN} not found"):
        kubetools.binary("kube-apiserver", build=False)
    (tmp_path / f"kube-apiserver-{PIN}").write_text("")
    assert kubetools.binary("kube-apiserver", build=False) == str(
        tmp_path / f"kube-apiserver-{PIN}")


def test_kubectl_follows_the_release(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """kubectl is the release under test's own (kubectl supports one minor of skew), not
    a .local/bin link or PATH's; AGGAPI_KUBECTL_BIN still names another one outright."""
    monkeypatch.setenv("AGGAPI_BIN_CACHE", str(tmp_path))
    monkeypatch.delenv("AGGAPI_KUBECTL_BIN", raising=False)
    for release in ("v1.99.1", PIN):
        monkeypatch.setenv("AGGAPI_KUBE_VERSION", release)
        (tmp_path / f"kubectl-{release}").write_text("")
        assert kubetools.binary("kubectl", build=False) == str(tmp_path / f"kubectl-{release}")
    monkeypatch.setenv("AGGAPI_KUBECTL_BIN", "/opt/kubectl-1.26/kubectl")
    assert kubetools.binary("kubectl", build=False) == "/opt/kubectl-1.26/kubectl"


def test_kubectl_is_built_from_the_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """hack/build-binaries.sh builds kubectl from the pinned k8s.io/kubernetes module and
    stamps its version as the other commands' (built on demand; cached after)."""
    monkeypatch.delenv("AGGAPI_KUBE_VERSION", raising=False)
    monkeypatch.delenv("AGGAPI_KUBECTL_BIN", raising=False)
    kubectl = kubetools.binary("kubectl")
    out = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    client = json.loads(out)["clientVersion"]
    assert client["gitVersion"] == PIN, client
    assert int(client["minor"]) == kubetools.kube_minor(PIN), client
    assert client["gitTreeState"] == "clean", client


def releases() -> list[str]:
    """The pin (built on demand: collection on a fresh machine sees an empty cache) and
    every other release already in the cache."""
    return sorted({kubetools.versions()["KUBE_VERSION"]}
                  | {p.name.removeprefix("kube-apiserver-")
                     for p in kubetools.bin_cache().glob("kube-apiserver-v1.*")})


@pytest.mark.parametrize("release", releases())
def test_table_matches_the_built_apiserver(release: str, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """SINCE says which releases lack the flag; each built kube-apiserver agrees."""
    monkeypatch.setenv("AGGAPI_KUBE_VERSION", release)
    monkeypatch.delenv("AGGAPI_KUBE_APISERVER_BIN", raising=False)
    apiserver = kubetools.binary("kube-apiserver", build=release == kubetools.versions()
                                 ["KUBE_VERSION"])
    out = subprocess.run([apiserver, "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    assert "--requestheader-client-ca-file" in out  # the help text is the real one
    assert ("--requestheader-uid-headers" in out) == kubetools.has(
        "apiserver-requestheader-uid", release)
    assert "--authentication-config" in out or not kubetools.has(
        "apiserver-anonymous-conditions", release)
    # The ImageVolume gate: absent before 1.31, listed with its default until it went GA
    # (locked on) in 1.36, where --help may drop it.
    gate = next((ln for ln in out.splitlines() if "ImageVolume=true|false" in ln), None)
    if not kubetools.has("gate-ImageVolume", release):
        assert gate is None, gate
    elif kubetools.kube_minor(release) < 36:
        assert gate is not None
    if gate is not None:
        on = kubetools.has("default-ImageVolume", release)
        assert f"default={str(on).lower()}" in gate, gate


def kcm_releases() -> list[str]:
    """The pin and every other release whose kube-controller-manager is in the cache."""
    return sorted({kubetools.versions()["KUBE_VERSION"]}
                  | {p.name.removeprefix("kube-controller-manager-")
                     for p in kubetools.bin_cache().glob("kube-controller-manager-v1.*")})


@pytest.mark.parametrize("release", kcm_releases())
def test_controllers_turned_off_exist_in_the_built_kcm(
        release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness turns off only controllers the release has: kube-controller-manager
    refuses an unknown name (1.37 dropped the cloud controllers), and SINCE agrees with
    each built binary's --help."""
    monkeypatch.setenv("AGGAPI_KUBE_VERSION", release)
    monkeypatch.delenv("AGGAPI_KUBE_CONTROLLER_MANAGER_BIN", raising=False)
    kcm = kubetools.binary("kube-controller-manager",
                           build=release == kubetools.versions()["KUBE_VERSION"])
    out = subprocess.run([kcm, "--help"], capture_output=True, text=True, timeout=60).stdout
    known = next(ln for ln in out.splitlines() if "All controllers:" in ln)
    assert "garbage-collector-controller" in known  # the help text is the real one
    gone = controllers.DISABLED[0] not in known
    assert gone == kubetools.has("kcm-without-cloud-controllers", release)
    for name in controllers.disabled():
        assert f" {name}," in known + ",", (name, known)


@pytest.mark.parametrize(("release", "endpoints"), [("v1.30.4", True), ("v1.32.0", True),
                                                    ("v1.34.3", False), ("v1.36.3", False)])
def test_endpoints_written_where_the_aggregator_reads_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, release: str, endpoints: bool) -> None:
    """kube-aggregator before 1.33 finds aggapi through v1 Endpoints: the harness writes
    them beside its EndpointSlices there (v1.30.4's APIService never became Available
    without them), and only there."""
    monkeypatch.setenv("AGGAPI_KUBE_VERSION", release)
    cp = ControlPlane(instance="e2e", state=tmp_path / "e2e")
    cp.aggapi_certs.mkdir(parents=True)
    (cp.aggapi_certs / "ca.crt").write_bytes(b"ca")
    objs = cp.objects()
    slices = {o["metadata"]["name"].removesuffix("-local"): o for o in objs
              if o["kind"] == "EndpointSlice"}
    eps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Endpoints"}
    assert slices
    if not endpoints:
        assert eps == {}
        return
    assert eps.keys() == slices.keys()
    for name, ep in eps.items():
        # The harness's own slice is the only one: kube-controller-manager's mirroring
        # controller would add a second (test_agent_endpointslice_has_node_name on 1.30).
        assert ep["metadata"]["labels"]["endpointslice.kubernetes.io/skip-mirror"] == "true"
        [subset] = ep["subsets"]
        assert [a["ip"] for a in subset["addresses"]] == slices[name]["endpoints"][0]["addresses"]
        assert [p["port"] for p in subset["ports"]] == [p["port"] for p in slices[name]["ports"]]
