"""The parts of ``bench_kubectl_cp --installed`` that decide its figures without a
cluster: the pod cgroup readings (v1 and v2 layouts), the tree digest both ends
compare, the variants' parsing; and the TLS floor it prints beside them."""

from __future__ import annotations

import hashlib
import json
import ssl
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import tls_floor
from benchmarks._cgroupstats import PodCgroup
from benchmarks._installed import REPO, local_digest, parse_variant, tree_digest


def test_cgroup_v1_usage_throttling_and_limit(tmp_path: Path) -> None:
    acct, cpu = tmp_path / "cpuacct", tmp_path / "cpu"
    acct.mkdir()
    cpu.mkdir()
    (acct / "cpuacct.usage").write_text("2500000000\n")
    (cpu / "cpu.stat").write_text("nr_periods 90\nnr_throttled 28\nthrottled_time 1500000000\n")
    (cpu / "cpu.cfs_quota_us").write_text("50000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    cg = PodCgroup(acct, cpu, v2=False)
    assert cg.cpu_seconds() == 2.5
    assert cg.throttling() == (28, 1.5)
    assert cg.cpu_limit() == 0.5
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cg.cpu_limit() is None


def test_cgroup_v2_usage_throttling_and_limit(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text(
        "usage_usec 4000000\nuser_usec 3000000\nsystem_usec 1000000\n"
        "nr_periods 10\nnr_throttled 3\nthrottled_usec 250000\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    cg = PodCgroup(tmp_path, tmp_path, v2=True)
    assert cg.cpu_seconds() == 4.0
    assert cg.throttling() == (3, 0.25)
    assert cg.cpu_limit() is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cg.cpu_limit() == 1.5


names = st.text("abcdef/", min_size=1, max_size=8).filter(
    lambda s: not s.startswith("/") and not s.endswith("/") and "//" not in s)


@settings(derandomize=True, database=None, max_examples=30)
@given(st.dictionaries(names, st.binary(max_size=64), min_size=1, max_size=6))
def test_local_tree_digest_is_the_sorted_sha256sum_listing(files: dict[str, bytes]) -> None:
    """What the container's ``find | xargs sha256sum`` yields, in any order, digests
    to what the local tree does; one changed byte changes it."""
    import tempfile

    # A path may not be both a file and a directory: keep the first of each clash.
    kept: dict[str, bytes] = {}
    for rel, data in files.items():
        parts = rel.split("/")
        if any("/".join(parts[:i]) in kept for i in range(1, len(parts))) \
                or any(k.startswith(rel + "/") for k in kept):
            continue
        kept[rel] = data
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for rel, data in kept.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        listing = {rel: hashlib.sha256(data).hexdigest() for rel, data in reversed(kept.items())}
        assert local_digest(root) == tree_digest(listing)
        first = next(iter(kept))
        (root / first).write_bytes(kept[first] + b"x")
        assert local_digest(root) != tree_digest(listing)


def test_variant_names_helm_values_the_ncp_checkout_and_the_image_suite(tmp_path: Path) -> None:
    v = parse_variant(f"t=suite=bookworm,agent.x=1,ncp={tmp_path},suite=trixie,b=c=d,"
                      f"src={tmp_path}/main")
    assert (v.label, v.sets, v.ncp_root, v.suite, v.src) == \
        ("t", ("agent.x=1", "b=c=d"), tmp_path.resolve(), "trixie", (tmp_path / "main").resolve())
    plain = parse_variant("as installed=")
    assert (plain.label, plain.sets, plain.ncp_root, plain.suite, plain.src) == \
        ("as installed", (), REPO, None, REPO)
    with pytest.raises(SystemExit, match="src= needs suite="):  # src= names an image build
        parse_variant(f"x=src={tmp_path}")


def test_tls_floor_json_holds_both_modes_and_the_runtime(capsys: pytest.CaptureFixture[str]) \
        -> None:
    """A real TLS pair over 127.0.0.1 (two processes, 4 MiB): the JSON line
    ``--image`` reads back from inside an image."""
    assert tls_floor.main(["--size-mib", "4", "--chunk-kib", "256", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["runtime"] == f"Python {sys.version.split()[0]}, {ssl.OPENSSL_VERSION}"
    for mode in ("asyncio", "blocking"):
        assert set(out[mode]) == {"receiver", "sender", "MiB_per_s"}
        assert out[mode]["receiver"] > 0 and out[mode]["sender"] > 0
