"""Image reference normalization (as containerd names records) and kubelet limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggapi import imageref
from aggapi.agent import kubeletconfig
from aggapi.agent.progress.ocimanifest import Platform, chain_ids

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(("ref", "want"), [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("index.docker.io/foo/bar", "docker.io/foo/bar:latest"),
    ("localhost/app", "localhost/app:latest"),
    ("127.0.0.1:5000/a/b:1", "127.0.0.1:5000/a/b:1"),
    (f"busybox:1.36@{D}", f"docker.io/library/busybox@{D}"),
    (f"ghcr.io/x/y@{D}", f"ghcr.io/x/y@{D}"),
])
def test_normalize(ref: str, want: str) -> None:
    assert imageref.normalize(ref) == want


@pytest.mark.parametrize("ref", ["", "Busybox", "a//b", "busybox@sha256:abc", "x:"])
def test_invalid(ref: str) -> None:
    with pytest.raises(imageref.InvalidReference):
        imageref.parse(ref)


def test_host_drops_port_as_containerd_labels_do() -> None:
    assert imageref.parse("127.0.0.1:5000/a/b:1").host == "127.0.0.1"


def test_platform_and_chain_ids() -> None:
    assert Platform("linux", "arm64").matches({"os": "linux", "architecture": "arm64",
                                               "variant": "v8"})
    assert not Platform("linux", "amd64").matches({"os": "linux", "architecture": "arm64"})
    a, b = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    assert chain_ids([a, b])[0] == a and chain_ids([a, b])[1] != b


async def test_kubelet_limits_from_yaml_json_and_missing(tmp_path: Path) -> None:
    y = tmp_path / "k.yaml"
    y.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                 "serializeImagePulls: false\nmaxParallelImagePulls: 3\n")
    lim = await kubeletconfig.KubeletConfigReader(str(y)).limits()
    assert (lim.serialize_image_pulls, lim.max_parallel_image_pulls, lim.parallel_slots) == (
        False, 3, 3)
    j = tmp_path / "k.json"
    j.write_text('{"kind": "KubeletConfiguration"}')
    lim = await kubeletconfig.KubeletConfigReader(str(j)).limits()
    assert (lim.serialize_image_pulls, lim.parallel_slots, lim.error) == (True, 1, "")
    lim = await kubeletconfig.KubeletConfigReader(str(tmp_path / "none"),
                                                  proc=str(tmp_path / "proc")).limits()
    # Unreadable: not known (never one slot as fact), with the reason.
    assert lim.error and lim.serialize_image_pulls is None and lim.parallel_slots is None
    assert lim.slots_json() == {"limit": None, "serialize": None, "source": str(tmp_path / "none"),
                                "error": lim.error}
    with pytest.raises(ValueError):
        kubeletconfig.parse("maxParallelImagePulls: 0")


def fake_kubelet(proc: Path, pid: int, argv: list[str], files: dict[str, str]) -> None:
    """A kubelet in a fake /proc: its command line and files under its root."""
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    for path, text in files.items():
        f = proc / str(pid) / "root" / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


CFG = "kind: KubeletConfiguration\nserializeImagePulls: true\n"


async def test_drop_ins_merge_in_lexical_order_and_flags_win(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_kubelet(proc, 77, ["/usr/bin/kubelet", "--config", "/var/lib/kubelet/config.yaml",
                            "--config-dir=/etc/kubelet.conf.d", "--v=2"], {
        "/var/lib/kubelet/config.yaml": CFG,
        "/etc/kubelet.conf.d/10-pulls.conf": "serializeImagePulls: false\n"
                                             "maxParallelImagePulls: 2\n",
        "/etc/kubelet.conf.d/20-more.conf": "maxParallelImagePulls: 5\n",
        "/etc/kubelet.conf.d/30-ignored.yaml": "maxParallelImagePulls: 9\n",  # not .conf
    })
    fake_kubelet(proc, 78, ["/usr/bin/kubelet", "--config=/other/config.yaml"],
                 {"/other/config.yaml": CFG})  # another node's kubelet on this host
    reader = kubeletconfig.KubeletConfigReader("/proc/1/root/var/lib/kubelet/config.yaml",
                                               proc=str(proc))
    lim = await reader.limits()
    assert (lim.serialize_image_pulls, lim.max_parallel_image_pulls, lim.parallel_slots,
            lim.error) == (False, 5, 5, "")
    assert "pid 77" in lim.source and "--config-dir=/etc/kubelet.conf.d" in lim.source
    # Command-line flags override the files, as in kubelet.
    (proc / "77" / "cmdline").write_bytes(b"\0".join(a.encode() for a in [
        "kubelet", "--config", "/var/lib/kubelet/config.yaml", "--config-dir",
        "/etc/kubelet.conf.d", "--max-parallel-image-pulls=3"]) + b"\0")
    assert (await reader.limits()).parallel_slots == 3
    (proc / "77" / "cmdline").write_bytes(b"\0".join(a.encode() for a in [
        "kubelet", "--config", "/var/lib/kubelet/config.yaml", "--serialize-image-pulls"])
        + b"\0")
    assert (await reader.limits()).parallel_slots == 1


async def test_a_flags_only_kubelet_has_kubelet_defaults(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_kubelet(proc, 5, ["/usr/local/bin/kubelet", "--serialize-image-pulls=false",
                           "--max-parallel-image-pulls", "4"], {})
    lim = await kubeletconfig.KubeletConfigReader("/nonexistent", proc=str(proc)).limits()
    assert (lim.parallel_slots, lim.error) == (4, "")


async def test_a_broken_drop_in_makes_the_limit_unknown(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_kubelet(proc, 9, ["kubelet", "--config=/c.yaml", "--config-dir=/d"], {
        "/c.yaml": CFG, "/d/a.conf": "serializeImagePulls: maybe\n"})
    lim = await kubeletconfig.KubeletConfigReader("/c.yaml", proc=str(proc)).limits()
    assert lim.parallel_slots is None and lim.serialize_image_pulls is None
    assert "serializeImagePulls must be a boolean" in lim.error
