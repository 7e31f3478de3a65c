"""The release as users receive it (hack/release.sh): image and chart from a registry that
wants credentials, each by digest, signed with cosign, the image's SBOM in SPDX JSON.

``installed_addon`` installed from it (tests/e2e/addon/conftest.py); these tests check
what the install took from the registry, and that a reference cosign refuses is never
installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tarfile
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.framework.addon import PULL_SECRET, Addon
from tests.framework.cluster import Cluster
from tests.framework.kubetools import binary
from tests.framework.release import RegistryLogin, Release, VerificationError, verify
from tests.framework.repo import REPO


def _release(a: Addon) -> Release:
    assert a.published is not None, "installed_addon installs from a release"
    return a.published


def _one_byte_changed(digest: str) -> str:
    algo, hexd = digest.split(":")
    return f"{algo}:{hexd[:-1]}{'0' if hexd[-1] != '0' else '1'}"


def test_pods_pull_the_release_image_by_digest_through_the_pull_secret(
        installed_addon: Addon) -> None:
    a, rel = installed_addon, _release(installed_addon)
    assert a.login is not None
    for p in a.apiserver_pods() + a.pods("agent"):
        spec = p["spec"]
        assert spec["imagePullSecrets"] == [{"name": PULL_SECRET}]
        (c,) = spec["containers"]
        assert (c["image"], c["imagePullPolicy"]) == (rel.image, "IfNotPresent")
        (st,) = p["status"]["containerStatuses"]
        assert st["imageID"].endswith(rel.image_digest), st
    # The registry refuses an anonymous pull: the nodes got the image with the Secret's
    # credentials (kubelet hands them to containerd through CRI).
    url = f"http://{rel.registry}/v2/aggapi/manifests/{rel.image_digest}"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=10)
    assert e.value.code == 401
    meta = json.loads(a.helm("get", "metadata", a.release, "-n", a.namespace,
                             "-o", "json").stdout)
    assert meta["version"] == rel.chart_version
    print(f"\nrelease: chart {rel.chart} {rel.chart_version}, pods run {rel.image}")


def test_cosign_verifies_the_release_and_refuses_tampered_digests(
        installed_addon: Addon, two_node_cluster: Cluster) -> None:
    a, rel = installed_addon, _release(installed_addon)
    assert a.login is not None
    for ref, digest in ((rel.image, rel.image_digest), (rel.chart_by_digest, rel.chart_digest)):
        # cosign prints the verified signature payloads: each names the signed digest.
        payloads = json.loads(verify(rel, ref).stdout)
        assert payloads and all(p["critical"]["image"]["docker-manifest-digest"] == digest
                                for p in payloads), payloads
    # Another image pushed to the release's repository (the harness's busybox), and
    # digests with one byte changed: cosign refuses each.
    other = _push_other_image(two_node_cluster, a.login, rel)
    assert other != rel.image
    tampered = {
        "another image": dataclasses.replace(rel, image=other,
                                             image_digest=other.split("@")[1]),
        "image digest, one byte changed": dataclasses.replace(
            rel, image=f"{rel.image.split('@')[0]}@{_one_byte_changed(rel.image_digest)}"),
        "chart digest, one byte changed": dataclasses.replace(
            rel, chart_digest=_one_byte_changed(rel.chart_digest)),
    }
    for what, bad in tampered.items():
        victim = Addon(a.cp, a.nodes, release="aggapi-tampered", namespace="aggapi-tampered",
                       published=bad, login=a.login, image_tag=None)
        with pytest.raises(VerificationError):
            victim.install(timeout=30)
        # Refused before anything was made: no helm release, no namespace, no Secret.
        assert not victim.installed(), what
        ns = a.kubectl("get", "namespace", victim.namespace, check=False)
        assert ns.returncode != 0 and "NotFound" in ns.stderr, what
    print(f"\nrelease: cosign verified image and chart; refused {', '.join(tampered)}")


def _apiserver_replicas(a: Addon, chart: list[str]) -> int:
    """spec.replicas of the apiserver Deployment ``helm template`` renders from ``chart``
    (the release's values as installed)."""
    server = json.loads(a.kubectl("version", "-o", "json").stdout)["serverVersion"]
    out = a.helm("template", "aggapi", *chart, "-n", a.namespace,
                 "--kube-version", server["gitVersion"]).stdout
    (dep,) = [d for d in yaml.safe_load_all(out)
              if d and d.get("kind") == "Deployment"]
    return int(dep["spec"]["replicas"])


def test_a_tag_moved_after_verification_is_not_what_gets_installed(
        installed_addon: Addon, tmp_path: Path) -> None:
    """helm install and upgrade take the chart by the digest cosign verified: a chart
    pushed over the version's tag afterwards (the registry's tags are mutable) changes
    nothing, while by ``--version`` it would have been taken."""
    a, rel = installed_addon, _release(installed_addon)
    args = a.chart_args()
    assert args[0] == f"oci://{rel.chart_by_digest}"
    flags = args[1:]
    with tarfile.open(rel.package) as t:
        t.extractall(tmp_path / "moved", filter="data")
    values = tmp_path / "moved" / "aggapi" / "values.yaml"
    text = values.read_text()
    assert "\n  replicas: 2\n" in text
    values.write_text(text.replace("\n  replicas: 2\n", "\n  replicas: 7\n", 1))
    moved = Path(a.helm("package", str(tmp_path / "moved" / "aggapi"), "-d",
                        str(tmp_path)).stdout.strip().rsplit(" ", 1)[-1])
    registry = rel.chart.removesuffix("/aggapi")
    a.helm("push", str(moved), registry, *flags)
    try:
        by_tag = [rel.chart, "--version", rel.chart_version, *flags]
        assert _apiserver_replicas(a, by_tag) == 7  # the tag now names the other chart
        assert _apiserver_replicas(a, args) == 2    # the verified one, whatever the tag
    finally:
        a.helm("push", str(rel.package), registry, *flags)  # the tag back on the release
    print(f"\nrelease: installs take {args[0]}; a chart pushed over "
          f"{rel.chart_version}'s tag was not")


def _push_other_image(cluster: Cluster, login: RegistryLogin, rel: Release) -> str:
    """The harness's busybox as REGISTRY/aggapi:tampered; its reference by digest."""
    digest_file = rel.out / "tampered.digest"
    src = cluster.registry.info.images["busybox"]
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                    "--dest-tls-verify=false", "--authfile", str(rel.auth_dir / "config.json"),
                    "--digestfile", str(digest_file), f"docker://{src}",
                    f"docker://{rel.registry}/aggapi:tampered"], check=True, timeout=120)
    return f"{rel.registry}/aggapi@{digest_file.read_text().strip()}"


def test_sbom_is_spdx_json_naming_the_images_python_packages(installed_addon: Addon) -> None:
    rel = _release(installed_addon)
    doc = json.loads(rel.sbom.read_text())
    assert doc["spdxVersion"].startswith("SPDX-2.")
    assert doc["dataLicense"] == "CC0-1.0"
    assert doc["SPDXID"] == "SPDXRef-DOCUMENT"
    assert doc["documentNamespace"] and doc["creationInfo"]["created"]
    ids = {p["SPDXID"] for p in doc["packages"]}
    assert len(ids) == len(doc["packages"]), "SPDXIDs are unique"
    for r in doc.get("relationships", []):
        assert r["spdxElementId"] in ids | {"SPDXRef-DOCUMENT"} | \
            {f["SPDXID"] for f in doc.get("files", [])}, r
    python = {p["name"].lower(): p.get("versionInfo") for p in doc["packages"]
              if any("pkg:pypi/" in ref.get("referenceLocator", "")
                     for ref in p.get("externalRefs", []))}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert python.get("aggapi") == project["version"], sorted(python)
    assert python.get("grpcio"), sorted(python)
    # The SBOM is attached to the image too, as an attestation signed with the release key.
    r = subprocess.run([binary("cosign"), "verify-attestation", "--key", str(rel.public_key),
                        "--type", "spdxjson", "--insecure-ignore-tlog=true",
                        "--allow-http-registry", "--allow-insecure-registry", rel.image],
                       capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "DOCKER_CONFIG": str(rel.auth_dir)})
    assert r.returncode == 0, r.stderr[-1500:]
    print(f"\nrelease: SBOM {len(doc['packages'])} packages, {len(python)} from PyPI "
          f"(aggapi {python['aggapi']}, grpcio {python['grpcio']}); attestation verified")
