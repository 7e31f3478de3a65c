"""The containerd flavour switch and the config files it writes (no containerd runs)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.framework import containerdconfig as cc
from tests.framework.procs import HarnessError


def settings_for(snapshotter: str = "overlayfs") -> cc.Settings:
    return cc.Settings(root=Path("/w/root"), state=Path("/w/state"), address="/w/c.sock",
                       hosts_dir=Path("/w/certs.d"), cni_conf_dir=Path("/w/cni"),
                       sandbox_image="127.0.0.1:5000/pause:1", snapshotter=snapshotter,
                       runc="/usr/sbin/runc")


def parsed(flavor: cc.Flavor, snapshotter: str = "overlayfs") -> dict[str, Any]:
    return tomllib.loads(cc.config_text(flavor, settings_for(snapshotter)))


def test_default_is_2_x_with_the_transfer_pull() -> None:
    assert cc.Flavor.from_env({}) == cc.Flavor(cc.V2, cc.TRANSFER)
    assert cc.Flavor.from_env({cc.ENV_VERSION: "1.6"}) == cc.Flavor(cc.V1_6, cc.LOCAL)
    assert cc.Flavor.from_env({cc.ENV_VERSION: "2.x"}) == cc.Flavor(cc.V2, cc.TRANSFER)
    assert cc.Flavor.from_env({cc.ENV_VERSION: "2", cc.ENV_PULL: "local"}) == \
        cc.Flavor(cc.V2, cc.LOCAL)


@pytest.mark.parametrize("env", [{cc.ENV_VERSION: "1.7"}, {cc.ENV_VERSION: "2.x", cc.ENV_PULL: "x"},
                                 {cc.ENV_VERSION: "1.6", cc.ENV_PULL: "transfer"}])
def test_bad_env_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(HarnessError):
        cc.Flavor.from_env(env)


def test_1_6_config_is_version_2_with_cri_under_grpc_plugin() -> None:
    cfg = parsed(cc.Flavor(cc.V1_6, cc.LOCAL))
    assert cfg["version"] == 2
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "127.0.0.1:5000/pause:1"
    assert cri["registry"]["config_path"] == "/w/certs.d"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == "/usr/sbin/runc"
    assert "io.containerd.cri.v1.images" not in cfg["plugins"]


@settings(max_examples=20, deadline=None)
@given(pull=st.sampled_from([cc.TRANSFER, cc.LOCAL]),
       snapshotter=st.sampled_from(["overlayfs", "native"]))
def test_2_x_config_is_version_3_and_both_pull_paths_see_the_hosts(
        pull: str, snapshotter: str) -> None:
    cfg = parsed(cc.Flavor(cc.V2, pull), snapshotter)
    assert cfg["version"] == 3
    plugins = cfg["plugins"]
    images = plugins["io.containerd.cri.v1.images"]
    assert images["use_local_image_pull"] is (pull == cc.LOCAL)
    assert images["snapshotter"] == snapshotter
    assert images["pinned_images"]["sandbox"] == "127.0.0.1:5000/pause:1"
    # The registry hosts reach the CRI plugin and the transfer service alike.
    assert images["registry"]["config_path"] == "/w/certs.d"
    transfer = plugins["io.containerd.transfer.v1.local"]
    assert transfer["config_path"] == "/w/certs.d"
    # The transfer service unpacks only into a listed snapshotter: ours.
    assert [u["snapshotter"] for u in transfer["unpack_config"]] == [snapshotter]
    runc = plugins["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
    assert runc["options"]["Root"] == "/w/state/runc"
    # Settings that would silently make 2.x fall back to local pull are absent.
    for key in ("max_concurrent_downloads", "discard_unpacked_layers", "mirrors", "configs"):
        assert key not in images and key not in images["registry"]
    assert "io.containerd.nri.v1.nri" in cfg["disabled_plugins"]
    assert "io.containerd.grpc.v1.cri" in plugins  # the stream server stays there
    assert "sandbox_image" not in plugins["io.containerd.grpc.v1.cri"]


def test_2_x_binaries_come_from_the_cache(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGAPI_BIN_CACHE", str(tmp_path))
    flavor = cc.Flavor(cc.V2, cc.TRANSFER)
    with pytest.raises(HarnessError, match=r"build-binaries\.sh containerd"):
        cc.binaries(flavor, build=False)
    ver = cc.pinned_version()
    assert ver.startswith("v2.")
    for name in ("containerd", cc.SHIM):
        (tmp_path / f"{name}-{ver}").write_text("")
    b = cc.binaries(flavor)
    assert b.containerd == str(tmp_path / f"containerd-{ver}")
    assert b.shim == str(tmp_path / f"{cc.SHIM}-{ver}")
    assert flavor.version_prefix() == ver
