"""Container states as kubelet writes them, for the property tests of what a pod's
object is built from (test_podslim, collections/test_build_kubepart)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

WAITING = [{}, {"waiting": {"reason": "ContainerCreating"}},
           {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
           {"waiting": {"reason": "ImagePullBackOff"}},
           {"waiting": {"reason": "InvalidImageName"}}]


def container_states(times: Sequence[str]) -> st.SearchStrategy[dict[str, Any]]:
    """A container's ``state``: waiting (or none yet), or running since one of ``times``."""
    return st.one_of(st.sampled_from(WAITING),
                     st.sampled_from(list(times)).map(lambda t: {"running": {"startedAt": t}}))
