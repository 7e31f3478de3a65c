"""The previous chart version the upgrade e2e installs first (tests.framework.release's
previous_chart): the chart of PREVIOUS_CHART_COMMIT as it was, but for kubeVersion, and
different enough from this one that an upgrade rolls both workloads."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.framework.kubetools import versions
from tests.framework.release import CHART_DIR, PREVIOUS_CHART_COMMIT, previous_chart
from tests.framework.repo import REPO


def _git_show(rel: Path) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), "show",
                           f"{PREVIOUS_CHART_COMMIT}:{CHART_DIR}/{rel}"],
                          capture_output=True, check=True, timeout=60).stdout


def _render(helm: str, chart: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, "template", "aggapi", str(chart), "--namespace", "aggapi",
                           "--kube-version", versions()["KUBE_VERSION"]],
                          capture_output=True, text=True, timeout=120)


def _workload_cpu_limits(rendered: str) -> dict[str, Any]:
    return {d["kind"]: [c["resources"]["limits"].get("cpu")
                        for c in d["spec"]["template"]["spec"]["containers"]]
            for d in yaml.safe_load_all(rendered)
            if d and d["kind"] in ("Deployment", "DaemonSet")}


def test_previous_chart_is_the_commits_chart_but_for_kube_version(
        helm: str, tmp_path: Path) -> None:
    chart = previous_chart(tmp_path)
    files = sorted(p.relative_to(chart) for p in chart.rglob("*") if p.is_file())
    assert Path("Chart.yaml") in files and Path("templates/apiserver.yaml") in files
    for rel in files:
        if rel != Path("Chart.yaml"):
            assert (chart / rel).read_bytes() == _git_show(rel), rel
    then = yaml.safe_load(_git_show(Path("Chart.yaml")))
    now = yaml.safe_load((chart / "Chart.yaml").read_text())
    current = yaml.safe_load((REPO / CHART_DIR / "Chart.yaml").read_text())
    assert now["kubeVersion"] == current["kubeVersion"]
    assert {k: v for k, v in now.items() if k != "kubeVersion"} == \
        {k: v for k, v in then.items() if k != "kubeVersion"}

    # Rewritten, it renders for the pinned Kubernetes; as it was, helm refuses it there.
    prev = _render(helm, chart)
    assert prev.returncode == 0, prev.stderr
    if then["kubeVersion"] != current["kubeVersion"]:
        as_was = tmp_path / "as-was" / "aggapi"
        shutil.copytree(chart, as_was)
        (as_was / "Chart.yaml").write_bytes(_git_show(Path("Chart.yaml")))
        r = _render(helm, as_was)
        assert r.returncode != 0 and "kubeVersion" in r.stderr, r.stderr

    # The upgrade rolls both workloads: the previous chart set CPU limits, this one does not.
    cur = _render(helm, REPO / CHART_DIR)
    assert cur.returncode == 0, cur.stderr
    assert _workload_cpu_limits(prev.stdout) == {"Deployment": ["1"], "DaemonSet": ["500m"]}
    assert _workload_cpu_limits(cur.stdout) == {"Deployment": [None], "DaemonSet": [None]}
