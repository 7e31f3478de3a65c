"""The chart's PrometheusRule (templates/prometheusrule.yaml) under the real promtool:
rendered with the default values, `promtool check rules` and the unit tests of
tests/manifests/rules/pulls_test.yaml, which must also fail when an alert's timing
changes (they pin what they claim). promtool comes from hack/build-binaries.sh
prometheus (github.com/prometheus/prometheus, pinned in hack/tools/versions.env)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from tests.manifests.conftest import PROMETHEUS_RULE_API as API
from tests.manifests.conftest import Render, find

RULE_TESTS = Path(__file__).parent / "rules" / "pulls_test.yaml"


def rules_dir(render: Render, where: Path, sets: Sequence[str] = ()) -> Path:
    docs = render(["prometheusRule.enabled=true", *sets], extra=API)
    rule = find(docs, "PrometheusRule")
    where.mkdir()
    (where / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    shutil.copy(RULE_TESTS, where / "pulls_test.yaml")
    return where


def promtool_run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_rules_check_and_their_unit_tests_pass(promtool: str, render: Render,
                                               tmp_path: Path) -> None:
    d = rules_dir(render, tmp_path / "rules")
    check = promtool_run(promtool, "check", "rules", "rules.yaml", cwd=d)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 4 rules found" in check.stdout, check.stdout
    test = promtool_run(promtool, "test", "rules", "pulls_test.yaml", cwd=d)
    assert test.returncode == 0, test.stdout + test.stderr


@pytest.mark.parametrize("change", ["prometheusRule.stalledFor=3m",
                                    "prometheusRule.slotsExhaustedFor=5m",
                                    "prometheusRule.rateCollapseFor=20m"])
def test_the_unit_tests_fail_when_an_alert_changes(promtool: str, render: Render,
                                                   tmp_path: Path, change: str) -> None:
    d = rules_dir(render, tmp_path / "rules", [change])
    test = promtool_run(promtool, "test", "rules", "pulls_test.yaml", cwd=d)
    assert test.returncode != 0, test.stdout


def test_no_rule_without_the_value_or_the_crd(render: Render) -> None:
    assert not [d for d in render([], extra=API) if d["kind"] == "PrometheusRule"]
    assert not [d for d in render(["prometheusRule.enabled=true"])
                if d["kind"] == "PrometheusRule"]


def test_the_agents_servicemonitor_labels_each_series_with_its_node(render: Render) -> None:
    docs = render(["serviceMonitor.enabled=true"],
                  extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"])
    sm = find(docs, "ServiceMonitor", "aggapi-agent")
    assert sm["spec"]["endpoints"][0]["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
