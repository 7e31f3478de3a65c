"""The chart README is helm-docs output of README.md.gotmpl and values.yaml: fresh, and
every value described."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.manifests.conftest import CHART, REPO, tool_or_skip


@pytest.fixture(scope="module")
def helm_docs() -> str:
    return tool_or_skip("helm-docs", "AGGAPI_HELM_DOCS_BIN")


def _check(helm_docs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "hack/gen-manifests.sh"), "--check-readme"],
                          capture_output=True, text=True, timeout=120,
                          env={"AGGAPI_HELM_DOCS_BIN": helm_docs, "PATH": "/usr/bin:/bin"})


def test_chart_readme_is_fresh(helm_docs: str) -> None:
    r = _check(helm_docs)
    assert r.returncode == 0, (
        f"stale chart README (run hack/gen-manifests.sh):\n{r.stdout}{r.stderr}")


def test_check_fails_on_a_values_comment_change(helm_docs: str, tmp_path: Path) -> None:
    """The check itself can fail: a repo copy whose values.yaml comment changed is stale."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "hack", root / "hack")
    shutil.copytree(CHART, root / "manifests/charts/aggapi")
    values = root / "manifests/charts/aggapi/values.yaml"
    values.write_text(values.read_text().replace("# -- Log level.", "# -- Log verbosity.", 1))
    r = subprocess.run(["bash", str(root / "hack/gen-manifests.sh"), "--check-readme"],
                       capture_output=True, text=True, timeout=120,
                       env={"AGGAPI_HELM_DOCS_BIN": helm_docs, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1 and "Log verbosity" in r.stdout, r.stdout + r.stderr


def test_every_value_is_described() -> None:
    rows = re.findall(r"(?m)^\| (\S+) \| \w+ \| .* \|(.*)\|$", (CHART / "README.md").read_text())
    assert len(rows) > 50
    undocumented = [key for key, desc in rows if not desc.strip()]
    assert not undocumented, f"values.yaml keys without a `# --` comment: {undocumented}"
    for key in ("apiserver.affinity", "agent.priorityClassName", "tls.helm.lookup",
                "serviceMonitor.authorization", "criticalPodsQuota"):
        assert key in dict(rows), key


def test_no_comment_line_opens_a_description_by_mistake() -> None:
    """helm-docs starts a value's description at any comment line opening with "-- ":
    a flag wrapped onto the start of a line ("# --always-allow-metrics).") cut the
    README's text of metricsAlwaysAllow down to "always-allow-metrics)."."""
    text = (CHART / "values.yaml").read_text()
    bad = [line for line in text.splitlines() if re.match(r"\s*# --\S", line)]
    assert not bad, bad
