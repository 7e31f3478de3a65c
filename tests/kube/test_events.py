"""Pull events count only when they say kubelet on the pod's node reported them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aggapi.kube.events import from_kubelet


def kubelet_event(node: str = "n1", *, legacy_only: bool = False) -> dict[str, Any]:
    ev: dict[str, Any] = {"reason": "Pulling", "source": {"component": "kubelet",
                                                          "host": node}}
    if not legacy_only:
        ev.update(reportingComponent="kubelet", reportingInstance=node)
    return ev


def test_kubelets_own_events_count() -> None:
    assert from_kubelet(kubelet_event(), "n1")
    assert from_kubelet(kubelet_event(legacy_only=True), "n1")
    assert from_kubelet(kubelet_event(), None)  # pod not scheduled: any host


# Each field an Event may set, and what a forger might put in it.
FIELDS = ("source.component", "source.host", "reportingComponent", "reportingInstance")


@given(st.dictionaries(st.sampled_from(FIELDS),
                       st.sampled_from(["", "kubelet", "n1", "n2", "default-scheduler",
                                        "tenant"])))
def test_an_event_counts_iff_every_set_field_says_kubelet_on_the_node(
        fields: dict[str, str]) -> None:
    ev: dict[str, Any] = {"source": {}}
    for k, v in fields.items():
        if k.startswith("source."):
            ev["source"][k.split(".")[1]] = v
        else:
            ev[k] = v
    comps = [v for k, v in fields.items() if k in FIELDS[::2] and v]
    hosts = [v for k, v in fields.items() if k in FIELDS[1::2] and v]
    want = bool(comps) and all(c == "kubelet" for c in comps) and bool(hosts) and all(
        h == "n1" for h in hosts)
    assert from_kubelet(ev, "n1") == want, ev
