"""The chart claims exactly the Kubernetes releases the support matrix passed (issue 17).

docs/support-matrix.md is written by hack/test-matrix.sh from its runs; Chart.yaml's
``kubeVersion`` must name the oldest and newest minor of those rows, every row must have
passed, and helm itself must refuse a release outside the range."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.framework import supportmatrix
from tests.framework.kubetools import kube_minor, versions
from tests.framework.repo import REPO

from .conftest import CHART

MATRIX = REPO / "docs/support-matrix.md"


def matrix_rows() -> list[dict[str, str]]:
    return supportmatrix.rows(MATRIX.read_text())


def passed_minors() -> list[int]:
    return sorted({kube_minor(r["kube"]) for r in matrix_rows()})


def test_every_cell_ran_and_passed() -> None:
    rows = matrix_rows()
    cells = {(r["kube"], r["containerd"]) for r in rows}
    kubes = {r["kube"] for r in rows}
    assert cells == {(k, c) for k in kubes for c in ("1.6", "2.x")}, sorted(cells)
    assert len(kubes) >= 3, kubes  # oldest served, a middle release, the pin
    for r in rows:
        assert r["failed"] == "0" and int(r["passed"]) > 0, r
    # The default run (the pin) is the newest release of the matrix.
    assert kube_minor(versions()["KUBE_VERSION"]) == passed_minors()[-1]


def test_chart_kube_version_is_the_range_that_passed() -> None:
    lo, hi = passed_minors()[0], passed_minors()[-1]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">=1.{lo}.0-0 <1.{hi + 1}.0-0", chart["kubeVersion"]


@pytest.mark.parametrize("where", ["below", "oldest", "newest", "above"])
def test_helm_applies_the_range(helm: str, where: str) -> None:
    lo, hi = passed_minors()[0], passed_minors()[-1]
    minor = {"below": lo - 1, "oldest": lo, "newest": hi, "above": hi + 1}[where]
    r = subprocess.run([helm, "template", "aggapi", str(CHART), "--namespace", "aggapi",
                        "--kube-version", f"v1.{minor}.3"], capture_output=True, text=True,
                       timeout=120)
    if where in ("oldest", "newest"):
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0 and "kubeVersion" in r.stderr, r.stderr
