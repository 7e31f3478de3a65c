"""The chart's Grafana dashboard of image pulls, generated: `python3 hack/dashboard.py`
prints the JSON that hack/gen-manifests.sh writes to
manifests/charts/aggapi/dashboards/image-pulls.json (tests/manifests/test_dashboard.py
checks it is fresh, that every query parses under promtool and names only metrics the
agent or the apiserver exports or the chart's rules record).

Panels are built from one small table so that a new metric is one line here. The
dashboard has a Prometheus data-source variable and a node variable; it is plain
dashboard JSON (schemaVersion 39), which Grafana's dashboard sidecar loads from a
ConfigMap labelled ``grafana_dashboard``.
"""

from __future__ import annotations

import json
from typing import Any

NODE = 'node=~"$node"'
# (title, unit, queries as (expr, legend), panel type, width)
PANELS: list[tuple[str, str, list[tuple[str, str]], str, int]] = [
    ("Pulls in flight", "short",
     [(f"sum by (node) (aggapi_agent_image_pulls_in_flight{{{NODE}}})", "{{node}}")],
     "timeseries", 8),
    ("Pull slots taken", "percentunit",
     [(f"sum by (node) (aggapi_agent_image_pulls_in_flight{{{NODE}}}) / on (node) "
       f"max by (node) (aggapi_agent_image_pull_slots{{{NODE}}})", "{{node}}")],
     "timeseries", 8),
    ("Stalled pulls", "short",
     [(f"sum by (node, registry) (aggapi_agent_image_pulls_stalled{{{NODE}}})",
       "{{node}} {{registry}}")],
     "timeseries", 8),
    ("Download rate by registry", "Bps",
     [(f"sum by (registry) (rate(aggapi_agent_image_pull_bytes_total{{{NODE}}}[$__rate_interval]))",
       "{{registry}}")],
     "timeseries", 12),
    ("Download rate by node while pulling", "Bps",
     [(f"aggapi:image_pull_bytes_per_second:sum_by_node_registry{{{NODE}}}",
       "{{node}} {{registry}}")],
     "timeseries", 12),
    ("Pull duration (p50, p90)", "s",
     [(f"histogram_quantile({q}, sum by (le) (rate("
       f"aggapi_agent_image_pull_duration_seconds_bucket{{{NODE}}}[$__rate_interval])))",
       f"p{int(q * 100)}") for q in (0.5, 0.9)],
     "timeseries", 12),
    ("Pull size (p50, p90)", "bytes",
     [(f"histogram_quantile({q}, sum by (le) (rate("
       f"aggapi_agent_image_pull_size_bytes_bucket{{{NODE}}}[$__rate_interval])))",
       f"p{int(q * 100)}") for q in (0.5, 0.9)],
     "timeseries", 12),
    # The fleet, from the leading apiserver's collections (apiserver.fleetMetrics): not
    # filtered by node; the other replicas export none, so sums count each pull once.
    ("Fleet: pulls in flight and waiting for a slot, by registry", "short",
     [("sum by (registry) (aggapi_apiserver_fleet_image_pulls_in_flight)",
       "{{registry}} in flight"),
      ("sum by (registry) (aggapi_apiserver_fleet_image_pulls_waiting)",
       "{{registry}} waiting")],
     "timeseries", 12),
    ("Fleet: nodes pulling and their rate, by registry", "short",
     [("sum by (registry) (aggapi_apiserver_fleet_nodes_pulling)", "{{registry}} nodes"),
      ("sum by (registry) (aggapi_apiserver_fleet_image_pull_bytes_per_second) / 1048576",
       "{{registry}} MiB/s")],
     "timeseries", 12),
]


def panel(i: int, x: int, y: int, title: str, unit: str, queries: list[tuple[str, str]],
          kind: str, width: int) -> dict[str, Any]:
    return {
        "id": i + 1, "type": kind, "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for j, (expr, legend) in enumerate(queries)],
    }


def dashboard() -> dict[str, Any]:
    panels, x, y = [], 0, 0
    for i, (title, unit, queries, kind, width) in enumerate(PANELS):
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(panel(i, x, y, title, unit, queries, kind, width))
        x += width
    return {
        "uid": "aggapi-image-pulls",
        "title": "aggapi / image pulls",
        "tags": ["aggapi", "kubernetes"],
        "editable": False,
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Data source"},
            {"name": "node", "type": "query", "label": "Node", "includeAll": True,
             "multi": True, "allValue": ".*",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(aggapi_agent_image_pulls_in_flight, node)",
             "refresh": 2},
        ]},
        "panels": panels,
    }


def main() -> None:
    print(json.dumps(dashboard(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
