"""A real containerd (+ runc) for tests, with a config of our own under a temp dir.

Nothing touches the system daemon's /run/containerd/containerd.sock or
/var/lib/containerd: socket, root, state, runc state and opt dir all live under
``workdir``. containerd 1.6 hard-codes its shims' sockets to /run/containerd/s/;
stop() removes the ones of our shims (computed as containerd does) and nothing
else. Synchronous on purpose: no event-loop affinity, so a session fixture can
share one instance with tests on any loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from tests.framework.procs import start_logged

BINARY = "/usr/bin/containerd"
RUNC = "/usr/sbin/runc"
SHIM_SOCKET_DIR = Path("/run/containerd/s")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def overlay_works(where: Path) -> bool:
    """True if an overlay mount works on ``where``'s filesystem (else use native)."""
    d = Path(tempfile.mkdtemp(prefix="ovl-probe-", dir=where))
    try:
        for sub in ("l", "u", "w", "m"):
            (d / sub).mkdir()
        opts = f"lowerdir={d / 'l'},upperdir={d / 'u'},workdir={d / 'w'}"
        r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(d / "m")],
                           capture_output=True, check=False)
        if r.returncode != 0:
            return False
        subprocess.run(["umount", str(d / "m")], check=False)
        return True
    finally:
        shutil.rmtree(d, ignore_errors=True)


def remove_cgroup_tree(rel: str) -> None:
    """rmdir ``rel`` and everything below it, leaves first, in every cgroup hierarchy.

    Only empty cgroups go away (rmdir fails on one with tasks), which is what we want.
    """
    if not CGROUP_ROOT.is_dir():
        return
    hierarchies = [h for h in CGROUP_ROOT.iterdir() if h.is_dir()]
    # cgroup v2 (unified): the root itself is the only hierarchy.
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        hierarchies = [CGROUP_ROOT]
    for hier in hierarchies:
        top = hier / rel.lstrip("/")
        if not top.is_dir():
            continue
        subdirs = [p for p in top.rglob("*") if p.is_dir()]
        for d in sorted(subdirs, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


class Containerd:
    """containerd with CRI enabled, runc, host-network sandboxes, local registries."""

    def __init__(self, workdir: str | os.PathLike[str] | None = None, *,
                 sandbox_image: str = "", snapshotter: str | None = None,
                 binary: str = BINARY, runc: str = RUNC) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="aggapi-ctd-"))
        self.root = self.workdir / "root"
        self.state = self.workdir / "state"
        self.address = str(self.workdir / "containerd.sock")
        # The socket path containerd binds, as its own mount namespace sees it (a cluster
        # node binds /run/containerd/containerd.sock there; clients here use ``address``).
        self.listen_address = self.address
        self.hosts_dir = self.workdir / "certs.d"
        self.log_path = self.workdir / "containerd.log"
        self.sandbox_image = sandbox_image
        self.snapshotter = snapshotter or ("overlayfs" if overlay_works(self.workdir)
                                           else "native")
        self.binary = binary
        self.runc = runc
        # Pods created through tests.framework.pods go under this cgroup, so stop()
        # can remove every cgroup our containers made.
        self.cgroup_parent = f"/aggapi-test-{uuid.uuid4().hex[:8]}"
        self.proc: subprocess.Popen[bytes] | None = None

    # --- config ----------------------------------------------------------------------

    def config_text(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.root}"
state = "{self.state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.listen_address}"
[ttrpc]
  address = "{self.listen_address}.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root}/opt"
[{cri}]
  sandbox_image = "{self.sandbox_image}"
  # This VM lacks CAP_SYS_RESOURCE: never lower oom_score_adj below ours.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "{self.snapshotter}"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{self.runc}"
  Root = "{self.state}/runc"
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{self.workdir}/cni/net.d"
[{cri}.registry]
  config_path = "{self.hosts_dir}"
"""

    def add_registry(self, host: str) -> None:
        """Let containerd pull from ``host`` (127.0.0.1:PORT) over plain HTTP.

        hosts.toml is read at each pull, so this works after start() too.
        """
        d = self.hosts_dir / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(
            f'server = "http://{host}"\n\n'
            f'[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n'
        )

    # --- lifecycle -------------------------------------------------------------------

    def write_config(self) -> Path:
        """Its directories and config.toml; returns the config's path."""
        if not Path(self.binary).exists():
            raise FileNotFoundError(f"{self.binary} missing: run hack/install-deps.sh")
        for d in (self.root, self.state, self.hosts_dir, self.workdir / "cni/net.d"):
            d.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "config.toml"
        cfg.write_text(self.config_text())
        return cfg

    def start(self, timeout: float = 20.0) -> None:
        cfg = self.write_config()
        try:
            self.proc = start_logged(
                [self.binary, "--config", str(cfg)], self.log_path, what="containerd",
                ready=lambda: self.socket_ready() and "serving..." in self.log_tail(100_000),
                log_tail=self.log_tail, timeout=timeout)
        except (RuntimeError, TimeoutError):
            self.stop()  # its shims, mounts and cgroups, if it got that far
            raise

    def socket_ready(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(self.address)
                return True
            except OSError:
                return False

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def shim_pids(self) -> dict[int, str]:
        """PIDs of the shims our containerd started -> their task id."""
        out: dict[int, str] = {}
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            args = [a.decode(errors="replace") for a in argv]
            if not args or "containerd-shim" not in args[0]:
                continue
            if "-address" in args and args[args.index("-address") + 1] == self.address:
                out[int(p.name)] = args[args.index("-id") + 1] if "-id" in args else ""
        return out

    def _shim_socket(self, task_id: str, namespace: str = "k8s.io") -> Path:
        # As containerd 1.6's shim.SocketAddress computes it.
        digest = hashlib.sha256(os.path.join(self.address, namespace, task_id).encode())
        return SHIM_SOCKET_DIR / digest.hexdigest()

    def stop(self) -> None:
        """Stop containerd, then clean up what it and its shims left behind.

        Remove pods first (tests.framework.pods) for a clean stop; this is the net
        for a test that crashed before doing so.
        """
        shims = self.shim_pids()
        # Killing a shim does not kill its containers (they get reparented to init):
        # delete them through runc first, then kill whatever is left in our cgroups.
        self._delete_runc_containers()
        self._kill_cgroup_procs()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the shim kills its containers with it
        for pid in shims:
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)
        for task_id in shims.values():
            with contextlib.suppress(OSError):
                self._shim_socket(task_id).unlink()
        for d in (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent):
            with contextlib.suppress(OSError):
                d.rmdir()  # only if empty: another containerd may be using it
        self._unmount_all()
        self._remove_cgroups()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _delete_runc_containers(self) -> None:
        runc_root = self.state / "runc"
        if not runc_root.is_dir():
            return
        for ns in runc_root.iterdir():
            for c in ns.iterdir() if ns.is_dir() else ():
                subprocess.run([self.runc, "--root", str(ns), "delete", "--force", c.name],
                               capture_output=True, check=False, timeout=30)

    def _kill_cgroup_procs(self) -> None:
        for hier in CGROUP_ROOT.glob("*"):
            top = hier / self.cgroup_parent.lstrip("/")
            for procs in top.rglob("cgroup.procs") if top.is_dir() else ():
                with contextlib.suppress(OSError, ValueError):
                    for pid in procs.read_text().split():
                        os.kill(int(pid), signal.SIGKILL)

    def _unmount_all(self) -> None:
        prefix = str(self.workdir) + "/"
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        for mp in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)

    def _remove_cgroups(self) -> None:
        remove_cgroup_tree(self.cgroup_parent)

    # --- clients ---------------------------------------------------------------------

    def cri_client(self) -> CRIClient:
        return CRIClient(self.address)

    def containerd_client(self, namespace: str = "k8s.io") -> ContainerdClient:
        return ContainerdClient(self.address, namespace)

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
