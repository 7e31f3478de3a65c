"""The apiserver's /metrics: names and types as docs/kep-aggapi.md's metrics table
lists them, process_* and python_* included, parsed from what a scrape returns."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.apiserver.conftest import Server

APISERVER_FAMILIES = {
    "aggapi_apiserver_requests": "counter",
    "aggapi_apiserver_request_duration_seconds": "histogram",
    "aggapi_apiserver_streams_in_flight": "gauge",
    "aggapi_apiserver_subjectaccessreviews": "counter",
    "aggapi_apiserver_authorization_cache": "counter",
    "aggapi_apiserver_tokenreviews": "counter",
    "aggapi_apiserver_token_cache": "counter",
    "aggapi_apiserver_authentication_failures": "counter",
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "python_info": "gauge",
    "python_gc_collections": "counter",
}


async def test_scraped_names_and_types(make_server: Any) -> None:
    srv: Server = await make_server(always_allow_metrics=True)
    async with srv.session().get("/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    got = {f.name: f for f in text_string_to_metric_families(text)}
    assert {n: got[n].type for n in APISERVER_FAMILIES if n in got} == APISERVER_FAMILIES
    for name, kind in APISERVER_FAMILIES.items():
        if kind == "counter":
            assert all(s.name == name + "_total" for s in got[name].samples), name
    assert got["process_cpu_seconds"].samples[0].value > 0
