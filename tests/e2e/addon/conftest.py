"""e2e against aggapi installed with helm (tests.framework.addon): the installed add-on.

``installed_addon`` (session): on the two-node cluster (``two_node_cluster``,
tests.framework.cluster), a release as users receive one: hack/release.sh pushes the
image (by digest) and the chart (OCI) to the cluster's htpasswd registry, with an SBOM
and cosign signatures; the harness's own aggapi objects removed, ``cosign verify`` of
both, then ``helm install aggapi oci://REGISTRY/charts/aggapi --version X`` with an
imagePullSecret and nothing else set: each node pulls the image by digest through the
Secret. Two monitoring values are set for test_prometheus.py (neither changes what the
other tests see): ``agent.metrics.pullStallSeconds`` (PULL_STALL_SECONDS), so a stall
alert comes in seconds, not minutes, and ``apiserver.fleetMetrics``, so the leader
exports the fleet's pulls. Then every pod Ready, and the image imported
on both nodes as localhost/aggapi:dev for the tests' own pods (SLEEPER) and local tags;
``helm uninstall`` at the end. ``addon_nodes`` names the nodes the apiserver and the agents run on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.framework.addon import CHECKOUT_ARCHIVE, Addon, addon_of, build_image, release_registry
from tests.framework.cluster import Cluster

# Seconds without a byte before the agents count a pull stalled (the chart's default is 60).
PULL_STALL_SECONDS = 5


@pytest.fixture(scope="session")
def installed_addon(two_node_cluster: Cluster) -> Iterator[Addon]:
    print(f"\naddon: image built or up to date in {build_image():.1f}s")
    addon = addon_of(two_node_cluster)
    addon.values += [f"agent.metrics.pullStallSeconds={PULL_STALL_SECONDS}",
                     "apiserver.fleetMetrics=true"]
    t0 = time.monotonic()
    rel = addon.publish(CHECKOUT_ARCHIVE, release_registry(two_node_cluster))
    print(f"\naddon: hack/release.sh in {time.monotonic() - t0:.1f}s: {rel.chart} "
          f"--version {rel.chart_version}, image {rel.image}")
    addon.remove_harness_objects()
    try:  # a failed install is uninstalled too: nothing half-installed stays
        times = addon.install()
        loaded = addon.load_image(CHECKOUT_ARCHIVE)
        print(f"\naddon: {times.line()}; sleeper image imported in {loaded:.1f}s")
        addon.install_times = times
        yield addon
    finally:
        t0 = time.monotonic()
        addon.uninstall()
        print(f"\naddon: helm uninstall in {time.monotonic() - t0:.1f}s")
