"""What a release runs: its pods, their readiness, the APIService's availability, and the
diagnosis of whatever is not Ready."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from tests.framework.addonbase import AddonBase
from tests.framework.controlplane import APISERVICE, GROUP, VERSION
from tests.framework.procs import HarnessError


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



class AddonState(AddonBase):
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
