"""``bench_kubectl_cp --installed --target-fs fresh`` without a cluster: the bench pod's
volume and its propagation, and :class:`benchmarks._freshfs.FreshFs` undoing exactly
what it made, in an order the kernel accepts, whichever step fails; and once for real
(loop device, mkfs.ext4, mount) where this runs as root."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks._freshfs import FreshFs, fresh_fs, image_bytes
from benchmarks._installed import DATA, bench_pod, container_ext4, machine_busy_s

NODE_NS = ["nsenter", "-t", "42", "--mount", "--"]


def test_bench_pod_sees_fresh_mounts_through_a_host_to_container_volume(tmp_path: Path) \
        -> None:
    pod = bench_pod("img", "aggapi-worker-2", tmp_path)
    spec = pod["spec"]
    assert spec["nodeName"] == "aggapi-worker-2"
    assert spec["volumes"] == [{"name": "data", "hostPath": {"path": str(tmp_path),
                                                             "type": "Directory"}}]
    (c,) = spec["containers"]
    assert c["volumeMounts"] == [{"name": "data", "mountPath": DATA,
                                  "mountPropagation": "HostToContainer"}]
    plain = bench_pod("img", "aggapi-worker-2", None)["spec"]  # --target-fs rootfs
    assert "volumes" not in plain and "volumeMounts" not in plain["containers"][0]


def test_only_a_mount_of_its_own_counts_as_the_fresh_file_system() -> None:
    """The hostPath at /data is itself on the host's root ext4: an upload directory below
    it that the mount never reached must not pass for a fresh file system."""
    mounts = ("overlay / overlay rw,relatime,lowerdir=/a,upperdir=/b,workdir=/c 0 0\n"
              "/dev/vda /data ext4 rw,relatime 0 0\n"
              "/dev/loop3 /data/up-small-ncp-r0 ext4 rw,relatime,noinit_itable 0 0\n"
              "proc /proc proc rw 0 0\n")
    got = container_ext4(mounts)
    assert "/data/up-small-ncp-r0" in got
    assert "/data/up-small-cp-r0" not in got and "/" not in got


class Kernel:
    """What mount, umount and losetup would do, checked as the kernel would: no umount
    of a mount with mounts below it, no detach of a mounted loop device. ``fail`` names
    the command (by position among all calls) that fails."""

    def __init__(self, fail: int | None = None) -> None:
        self.mounts: dict[str, str] = {}  # mount point -> source (a device, or itself)
        self.loops: dict[str, str] = {}   # device -> image
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(argv)
        if self.fail == len(self.calls) - 1:
            raise subprocess.CalledProcessError(1, argv, "", "injected")
        cmd = argv[len(NODE_NS):] if argv[:len(NODE_NS)] == NODE_NS else argv
        if cmd[0] == "mkfs.ext4":
            assert Path(cmd[-1]).exists()
        elif cmd[0] == "losetup" and "--find" in cmd:
            dev = f"/dev/loop{len(self.loops) + len(self.calls)}"
            self.loops[dev] = cmd[-1]
            return dev + "\n"
        elif cmd[:2] == ["losetup", "-d"]:
            assert cmd[2] not in self.mounts.values(), "detached while mounted"
            del self.loops[cmd[2]]
        elif cmd[:2] == ["mount", "--bind"]:
            self.mounts[cmd[3]] = cmd[2]
        elif cmd[:2] == ["mount", "--make-shared"]:
            assert cmd[2] in self.mounts
        elif cmd[0] == "mount":
            assert cmd[-2] in self.loops and Path(cmd[-1]).is_dir()
            self.mounts[cmd[-1]] = cmd[-2]
        elif cmd[0] == "umount":
            if [m for m in self.mounts if m.startswith(cmd[1] + "/")]:
                # EBUSY: only after an injected failure left a mount below it
                assert self.fail is not None and self.fail < len(self.calls) - 1
                raise subprocess.CalledProcessError(32, argv, "", "target is busy")
            del self.mounts[cmd[1]]
        return ""


def test_close_undoes_in_reverse_mounts_before_devices_before_images(tmp_path: Path) -> None:
    k = Kernel()
    fs = FreshFs(tmp_path / "images", k)
    shared = fs.share(tmp_path / "shared", NODE_NS)
    pod_side = fs.make("up", shared, image_bytes(40 << 20), NODE_NS)
    here = fs.make("back", tmp_path, image_bytes(40 << 20))
    assert pod_side == shared / "up" and here == tmp_path / "back"
    assert set(k.mounts) == {str(shared), str(pod_side), str(here)}
    images = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert images == ["back.img", "up.img"]
    assert (tmp_path / "images" / "up.img").stat().st_size == 1 << 30  # sparse, 1 GiB
    dev_pod, dev_here = k.mounts[str(pod_side)], k.mounts[str(here)]
    made = len(k.calls)
    assert fs.close() == []
    undone = [" ".join(c[len(NODE_NS):] if c[:len(NODE_NS)] == NODE_NS else c)
              for c in k.calls[made:]]
    assert undone == [f"umount {here}", f"losetup -d {dev_here}", f"umount {pod_side}",
                      f"losetup -d {dev_pod}", f"umount {shared}"]
    assert all(c[:len(NODE_NS)] == NODE_NS for c in k.calls[made:][2:5:2])  # node's ns
    assert not k.mounts and not k.loops
    assert not (tmp_path / "images").exists() or not any((tmp_path / "images").iterdir())
    assert not shared.exists() and not here.exists()


@settings(derandomize=True, database=None, max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["share", "pod", "here"]), min_size=1, max_size=6),
       st.integers(min_value=0, max_value=40) | st.none(),
       st.integers(min_value=0, max_value=20) | st.none())
def test_any_failing_step_leaves_nothing_behind(plan: list[str], fail: int | None,
                                                fail_undo: int | None) -> None:
    """Whichever command fails while making (it raises) or while undoing (reported, the
    rest still run), close() leaves no mount, loop device, image or directory it made,
    and never unmounts or detaches in an order the kernel would refuse; a failed umount
    leaves that mount and its device, and says so."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        k = Kernel(fail)
        fs = FreshFs(root / "images", k)
        shared: Path | None = None
        try:
            for i, step in enumerate(plan):
                if step == "share" and shared is None:
                    shared = fs.share(root / "shared", NODE_NS)
                elif step == "pod" and shared is not None:
                    fs.make(f"up{i}", shared, 1 << 20, NODE_NS)
                else:
                    fs.make(f"back{i}", root, 1 << 20)
        except subprocess.CalledProcessError:
            assert fail is not None
        made = len(k.calls)
        if fail_undo is not None:
            k.fail = made + fail_undo
        failed = fs.close()
        if k.fail is not None and made <= k.fail < len(k.calls):
            # What it could not undo stays, reported: that mount, its device and image
            # (and a mount it sits in, busy); everything else is gone.
            assert failed and "injected" in failed[0]
            assert len(k.mounts) <= 2 and len(k.loops) <= 1
            images = root / "images"
            assert len(list(images.iterdir()) if images.exists() else []) <= 1
            return
        assert failed == []
        assert not k.mounts and not k.loops
        assert sorted(p.name for p in root.iterdir()) in ([], ["images"])
        assert not any((root / "images").iterdir()) if (root / "images").exists() else True


def test_fresh_fs_reports_what_it_could_not_undo(tmp_path: Path) -> None:
    k = Kernel()
    said: list[str] = []
    with fresh_fs(tmp_path / "images", k, said.append) as fs:
        mnt = fs.make("x", tmp_path, 1 << 20)
        k.fail = len(k.calls)  # the umount
    assert said == [f"bench: clean-up failed: umount {mnt}: injected"]
    # Still mounted: its device stays attached and its image and mount point stay.
    assert str(mnt) in k.mounts and k.mounts[str(mnt)] in k.loops
    assert mnt.is_dir() and (tmp_path / "images" / "x.img").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("losetup")
                    or not Path("/dev/loop-control").exists(), reason="needs root and loop")
def test_a_real_fresh_fs_is_a_journaled_ext4_and_goes_entirely(tmp_path: Path) -> None:
    fs = FreshFs(tmp_path / "images")
    mnt = fs.make("real", tmp_path, image_bytes(0))
    try:
        line = next(x.split() for x in Path("/proc/self/mounts").read_text().splitlines()
                    if x.split()[1] == str(mnt))
        dev, fstype = line[0], line[2]
        assert fstype == "ext4" and dev.startswith("/dev/loop")
        features = subprocess.run(["dumpe2fs", "-h", dev], capture_output=True,
                                  text=True).stdout
        assert "has_journal" in features
        (mnt / "f").write_bytes(b"x" * 4096)
    finally:
        assert fs.close() == []
    assert not mnt.exists() and not (tmp_path / "images" / "real.img").exists()
    out = subprocess.run(["losetup", "-j", str(tmp_path / "images" / "real.img")],
                         capture_output=True, text=True).stdout
    assert out == ""


def test_machine_busy_counts_all_but_idle_and_iowait() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    stat = (f"cpu  {3 * hz} {hz} {2 * hz} {100 * hz} {7 * hz} {hz} {hz} {hz} {5 * hz} 0\n"
            "cpu0 1 2 3 4 5 6 7 8 9 0\n")
    assert machine_busy_s(stat) == 9.0  # user, nice, system, irq, softirq, steal
    now = machine_busy_s()
    assert 0 < now <= machine_busy_s()
