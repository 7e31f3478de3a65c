"""e2e against aggapi installed with helm (tests.framework.addon): the installed add-on.

``installed_addon`` (session): on the two-node cluster (``two_node_cluster``,
tests.framework.cluster), the image loaded on both nodes, the harness's own aggapi objects
removed, ``helm install`` of manifests/charts/aggapi with nothing but the image values, then
every pod Ready; ``helm uninstall`` at the end. ``addon_nodes`` names the nodes the
apiserver and the agents run on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.framework.addon import CHECKOUT_ARCHIVE, Addon, addon_of, build_image
from tests.framework.cluster import Cluster


@pytest.fixture(scope="session")
def installed_addon(two_node_cluster: Cluster) -> Iterator[Addon]:
    print(f"\naddon: image built or up to date in {build_image():.1f}s")
    addon = addon_of(two_node_cluster)
    loaded = addon.load_image(CHECKOUT_ARCHIVE)
    addon.remove_harness_objects()
    try:  # a failed install is uninstalled too: nothing half-installed stays
        times = addon.install()
        print(f"\naddon: image loaded in {loaded:.1f}s; {times.line()}")
        addon.install_times = times
        yield addon
    finally:
        t0 = time.monotonic()
        addon.uninstall()
        print(f"\naddon: helm uninstall in {time.monotonic() - t0:.1f}s")
