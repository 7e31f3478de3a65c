"""From (pod uid, container name) to an open, verified container root.

The pid comes from CRI ContainerStatus(verbose). Then, in this order: open a
pidfd on it, open ``/proc/<pid>/root`` (O_PATH|O_DIRECTORY), read its id maps,
check the pidfd has not exited, and ask CRI once more that the container is
still running with that pid. A pid recycled between CRI's answer and our opens
fails one of these checks. VM runtimes (Kata, Firecracker, gVisor...) are
refused: their "container pid" is a VMM or sandbox process whose root is not
the container's file system.

The process's credentials (uid, gid, groups from /proc/<pid>/status) are read
with the rest: copies act as that user unless the agent runs with
``--copy-as-root``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from aggapi.agent.copy.creds import Creds
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.idmap import IdMap
from aggapi.agent.copy.workers import Workers
from aggapi.status import StatusError

log = logging.getLogger(__name__)

VM_HINTS = ("kata", "firecracker", "cloud-hypervisor", "qemu", "runsc", "gvisor", "vm")
VM_COMMS = ("qemu", "kata", "firecracker", "cloud-hyperviso", "runsc", "crosvm")
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"


def _refuse_vm(what: str) -> StatusError:
    return StatusError(501, f"copy is not supported for containers of VM runtime {what!r}: "
                       "their processes are not host processes, so the agent cannot reach "
                       "their file systems safely")


def is_vm_runtime(name: str | None) -> bool:
    n = (name or "").lower()
    return any(h in n for h in VM_HINTS)


def is_running(state: Any) -> bool:
    """CRI ContainerState: CONTAINER_RUNNING (= 1), as a name or a number."""
    if isinstance(state, int):
        return state == 1
    return "RUNNING" in str(state).upper()


def open_process_root(pid: int, *, container_id: str = "", pod_uid: str = "",
                      container_name: str = "", proc: str = "/proc",
                      as_root: bool = False) -> FsRoot:
    """Blocking: pidfd, root dirfd, id maps and credentials of a live host process.

    ``as_root``: copies act as the agent (root) instead of the process's user."""
    if pid <= 0:
        raise StatusError(409, "container has no process")
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError as exc:
        raise StatusError(409, f"container {container_name or container_id} is not running") \
            from exc
    root_fd = -1
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            comm = f.read().strip()
        if any(c in comm.lower() for c in VM_COMMS):
            raise _refuse_vm(comm)
        root_fd = os.open(f"{proc}/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        uid_map = IdMap.read(f"{proc}/{pid}/uid_map")
        gid_map = IdMap.read(f"{proc}/{pid}/gid_map")
        creds = None if as_root else Creds.of_pid(pid, proc)
        root = FsRoot(root_fd, uid_map, gid_map, pidfd=pidfd, pid=pid,
                      container_id=container_id, pod_uid=pod_uid, container_name=container_name,
                      creds=creds)
    except FileNotFoundError as exc:
        _close(root_fd, pidfd)
        raise StatusError(409, f"container {container_name or container_id} exited") from exc
    except BaseException:
        _close(root_fd, pidfd)
        raise
    if not root.alive():  # the pid died (and may be reused) while we were opening
        root.close()
        raise StatusError(409, f"container {container_name or container_id} exited")
    return root


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


class CRIResolver:
    """Resolves containers through an aggapi.runtime.cri.CRIClient."""

    def __init__(self, cri: Any, workers: Workers, *, as_root: bool = False) -> None:
        self.cri = cri
        self.workers = workers
        self.as_root = as_root  # --copy-as-root

    async def _open(self, status: Any, pod_uid: str, name: str) -> FsRoot:
        if is_vm_runtime(getattr(status, "runtime_type", None)):
            raise _refuse_vm(status.runtime_type)
        pid = getattr(status, "pid", None)
        if not pid:
            raise StatusError(409, f"container {name}: runtime reports no process id")
        root = await self.workers.run(open_process_root, int(pid), container_id=status.id,
                                      pod_uid=pod_uid, container_name=name,
                                      as_root=self.as_root)
        again = await self.cri.container_status(status.id, verbose=True)
        if again is None or not is_running(again.state) or again.pid != pid:
            root.close()
            raise StatusError(409, f"container {name} stopped or restarted; retry")
        return root

    async def resolve(self, pod_uid: str, container: str) -> FsRoot:
        sandboxes = await self.cri.list_pod_sandboxes(labels={POD_UID_LABEL: pod_uid})
        if not sandboxes:
            raise StatusError(404, f"pod {pod_uid} has no sandbox on this node")
        statuses = []
        for sb in sandboxes:
            handler = getattr(sb, "runtime_handler", "")
            if is_vm_runtime(handler):
                raise _refuse_vm(handler)
            for c in await self.cri.list_containers(sandbox_id=sb.id,
                                                    labels={CONTAINER_NAME_LABEL: container}):
                st = await self.cri.container_status(c.id, verbose=True)
                if st is not None:
                    statuses.append(st)
        if not statuses:
            raise StatusError(404, f'container "{container}" not found in pod {pod_uid}')
        running = [s for s in statuses if is_running(s.state)]
        if not running:
            states = ", ".join(sorted({str(s.state) for s in statuses}))
            raise StatusError(409, f'container "{container}" is not running ({states})')
        return await self._open(running[0], pod_uid, container)

    async def by_id(self, container_id: str) -> FsRoot | None:
        st = await self.cri.container_status(container_id, verbose=True)
        if st is None or not is_running(st.state) or not st.pid:
            return None
        try:
            return await self._open(st, "", getattr(st, "name", ""))
        except StatusError as exc:
            log.info("container %s: %s", container_id, exc.message)
            return None
