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

from tests.framework.addon import Addon, addon_of
from tests.framework.cluster import Cluster


@pytest.fixture(scope="session")
def installed_addon(two_node_cluster: Cluster) -> Iterator[Addon]:
    addon = addon_of(two_node_cluster)
    loaded = addon.load_image()
    addon.remove_harness_objects()
    times = addon.install()
    print(f"\naddon: image loaded in {loaded:.1f}s; {times.line()}")
    addon.install_times = times
    try:
        yield addon
    finally:
        t0 = time.monotonic()
        addon.uninstall()
        print(f"\naddon: helm uninstall in {time.monotonic() - t0:.1f}s")
