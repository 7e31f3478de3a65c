"""What kubelet changes on this host (sysctls, mounts, /var/log/containers links,
/var/lib/kubelet): recorded before it starts, undone after it stops."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

from tests.framework.kubeletlayout import KubeletLayout

# Sysctls kubelet sets when protectKernelDefaults is false (pkg/kubelet/cm, setupKernelTunables):
# recorded before it starts, restored after it stops.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")


class HostChanges(KubeletLayout):
    def prepare_host(self) -> None:
        """Record what kubelet changes on this host (sysctls, /var/lib/kubelet)."""
        self._record_sysctls()
        if not Path("/var/lib/kubelet").exists():
            (self.dir / "made-var-lib-kubelet").touch()

    @staticmethod
    def _unmount_under(d: Path) -> None:
        prefix = str(d) + "/"
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        for mp in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)

    def _remove_container_log_links(self) -> None:
        """kubelet links /var/log/containers/*.log (a fixed path) into podLogsDir."""
        links = Path("/var/log/containers")
        if not links.is_dir():
            return
        for link in links.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(self.pod_logs_dir)):
                    link.unlink()
        with contextlib.suppress(OSError):
            links.rmdir()  # only if empty

    def _record_sysctls(self) -> None:
        if self._sysctls:
            return
        saved = self.dir / "sysctls.json"
        if saved.exists():  # a previous run died before restoring: keep the originals
            self._sysctls = json.loads(saved.read_text())
            return
        for k in KERNEL_TUNABLES:
            with contextlib.suppress(OSError):
                self._sysctls[k] = Path("/proc/sys", k).read_text().strip()
        saved.write_text(json.dumps(self._sysctls))

    def _restore_sysctls(self) -> None:
        saved = self.dir / "sysctls.json"
        if not self._sysctls and saved.exists():
            self._sysctls = json.loads(saved.read_text())
        for k, v in self._sysctls.items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", k).write_text(v)
        saved.unlink(missing_ok=True)
        self._sysctls = {}
