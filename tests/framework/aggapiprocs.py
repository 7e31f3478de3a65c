"""aggapi's processes on the control plane: ``aggapi apiserver`` and ``aggapi agent`` in their
network namespaces, their flags, and the APIService's availability."""

from __future__ import annotations

import functools
import json
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from tests.framework import nodestate
from tests.framework.cpaccess import AdminAccess
from tests.framework.cplayout import (
    AGENT_PORT,
    AGENT_SERVICE,
    AGGAPI_PORT,
    APISERVICE,
    GROUP,
    NAMESPACE,
    VERSION,
)
from tests.framework.procs import Proc, spawn
from tests.framework.repo import REPO, python_env


@functools.cache
def supported_flags(command: str) -> frozenset[str]:
    """The ``--flags`` that ``aggapi <command> --help`` lists."""
    cp = subprocess.run([sys.executable, "-m", "aggapi", command, "--help"], text=True,
                        capture_output=True, cwd=REPO)
    return frozenset(re.findall(r"(--[a-z][a-z0-9-]*)", cp.stdout))

class AggapiProcesses(AdminAccess):
    def apiserver_args(self, extra: Sequence[str] = ()) -> list[str]:
        c = self.aggapi_certs
        wanted = [
            f"--bind-address={self.api_host.address}", f"--secure-port={AGGAPI_PORT}",
            f"--tls-cert-file={c / 'apiserver.crt'}",
            f"--tls-private-key-file={c / 'apiserver.key'}",
            f"--kubeconfig={self.state / 'aggapi-apiserver.kubeconfig'}",
            # Towards the agents; passed once `aggapi apiserver` has these flags.
            f"--certs-dir={c}",
            f"--agent-ca-file={c / 'ca.crt'}",
            f"--agent-client-cert-file={c / 'agent-client.crt'}",
            f"--agent-client-key-file={c / 'agent-client.key'}",
            f"--token-signing-key-file={c / 'token-signing.key'}",
            f"--agent-namespace={NAMESPACE}", f"--agent-service={AGENT_SERVICE}",
            "--agent-port-name=https",
            # The harness's agents run outside pods: its EndpointSlices name no pod.
            "--agent-pod-check=false",
        ]
        known = supported_flags("apiserver")
        if "--tls-private-key-file" not in known:  # the flag's earlier name
            wanted.append(f"--tls-key-file={c / 'apiserver.key'}")
        return [sys.executable, "-m", "aggapi", "apiserver",
                *(a for a in wanted if a.split("=", 1)[0] in known), *extra]

    def agent_args(self, *, cri_socket: str, containerd_socket: str | None = None,
                   kubelet_config: str | None = None, extra: Sequence[str] = ()) -> list[str]:
        args = [
            sys.executable, "-m", "aggapi", "agent",
            f"--node-name={self.node_name}",
            f"--certs-dir={self.aggapi_certs}",  # agent.crt/key, ca.crt, token-signing.pub
            f"--bind-address={self.node_host.address}", f"--secure-port={AGENT_PORT}",
            f"--cri-address={cri_socket}",
            f"--containerd-address={containerd_socket or cri_socket}",
        ]
        if kubelet_config:
            args.append(f"--kubelet-config={kubelet_config}")
        return [*args, *extra]

    def start_apiserver(self, extra: Sequence[str] = (), *, wait: float = 60.0) -> Proc:
        """Start ``aggapi apiserver`` in its namespace; wait until the APIService is Available."""
        p = self.proc("aggapi-apiserver")
        if not p.alive():
            p = spawn("aggapi-apiserver",
                      [*self.api_host.exec_prefix(), *self.apiserver_args(extra)],
                      self.state, env=python_env())
        if wait:
            self._wait(self.apiservice_available, wait, "APIService Available", p)
        return p

    def start_agent(self, *, cri_socket: str, wait: float = 30.0, **kw: Any) -> Proc:
        """Start ``aggapi agent`` in the node's namespace; wait until its port accepts."""
        p = self.proc(nodestate.AGENT_PROC)
        if not p.alive():
            argv = [*self.node_host.exec_prefix(), *self.agent_args(cri_socket=cri_socket, **kw)]
            p = spawn(nodestate.AGENT_PROC, argv, self.state, env=python_env())
        if wait:
            self._wait(lambda: self._port_open(self.node_host.address, AGENT_PORT), wait,
                       "aggapi agent port", p)
        return p

    @staticmethod
    def _port_open(host: str, port: int) -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    def apiservice_available(self) -> bool:
        try:
            code, body = self.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
        except OSError:
            return False
        if code != 200:
            return False
        conds = json.loads(body).get("status", {}).get("conditions") or []
        if not any(c.get("type") == "Available" and c.get("status") == "True" for c in conds):
            return False
        # The condition lags behind the backend: also ask the backend, through the aggregator.
        try:
            return self.get(f"/apis/{GROUP}/{VERSION}")[0] == 200
        except OSError:
            return False
