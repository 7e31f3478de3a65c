"""docs/kep-aggapi.md's metrics table against both binaries' registries: every
aggapi_* metric listed with its real type, labels and help text, and none missing."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from aggapi.agent.metrics import AgentMetrics
from aggapi.apiserver.metrics import Metrics

KEP = Path(__file__).resolve().parents[1] / "docs" / "kep-aggapi.md"
Row = tuple[str, str, tuple[str, ...], str]  # type, family name, labels, help


def documented() -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for line in KEP.read_text().splitlines():
        if not line.startswith("| `aggapi_"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name, kind, labels, help_text = cells[0].strip("`"), cells[1], cells[2], cells[3]
        rows[name] = (kind, name, tuple(re.findall(r"`([a-z_]+)`", labels)), help_text)
    return rows


def exported(owner: object, registry: CollectorRegistry) -> dict[str, Row]:
    labels = {m._name: tuple(m._labelnames) for m in vars(owner).values()
              if isinstance(m, MetricWrapperBase)}
    out: dict[str, Row] = {}
    for fam in registry.collect():
        if not fam.name.startswith("aggapi_"):
            continue
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = (fam.type, name, labels.get(fam.name, ()), fam.documentation)
    return out


def test_the_table_is_what_both_binaries_export() -> None:
    agent = AgentMetrics()
    agent.bind(subscribers=lambda: 0, runtime_calls=lambda: 0, sent=lambda _r: (0, False))
    apiserver = Metrics()
    real = {**exported(agent, agent.registry), **exported(apiserver, apiserver.registry)}
    doc = documented()
    assert len(real) >= 19
    assert doc == real


def test_both_registries_carry_process_and_python_metrics() -> None:
    for registry in (AgentMetrics().registry, Metrics().registry):
        names = {fam.name for fam in registry.collect()}
        assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info",
                "python_gc_collections"} <= names
