"""requestheader-* settings from the authentication ConfigMap fail closed (issue 13,
finding 8): only a JSON array of non-empty strings (or an absent key) is believed;
anything else turns front-proxy authentication off instead of meaning "any name"."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.authconfig import AuthConfigSource, parse_configmap
from aggapi.kube.client import KubeClient
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .conftest import FRONT_PROXY_CN, PROGRESS, Pki, Server, auth_configmap

KEY = "requestheader-allowed-names"
LIST_KEYS = (KEY, "requestheader-username-headers", "requestheader-uid-headers",
             "requestheader-group-headers", "requestheader-extra-headers-prefix")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10)


def _valid(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value)


def _data(certs: Pki, **override: str) -> dict[str, str]:
    data: dict[str, str] = auth_configmap(certs)["data"]
    data.update(override)
    return data


@pytest.fixture(scope="module")
def module_certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    from aggapi.tls import pki
    d = tmp_path_factory.mktemp("pki")
    return Pki(d, pki.new_ca("s"), pki.new_ca("c"), pki.new_ca("fp"), pki.new_ca("o"))


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(LIST_KEYS), value=json_values)
def test_only_arrays_of_non_empty_strings_enable_header_auth(
        module_certs: Pki, key: str, value: Any) -> None:
    cfg = parse_configmap(_data(module_certs, **{key: json.dumps(value)}))
    if _valid(value):
        assert cfg.requestheader_cas and not cfg.requestheader_error
        field = {KEY: cfg.allowed_names, LIST_KEYS[1]: cfg.username_headers,
                 LIST_KEYS[2]: cfg.uid_headers, LIST_KEYS[3]: cfg.group_headers,
                 LIST_KEYS[4]: cfg.extra_prefixes}[key]
        assert field == tuple(value)
    else:
        # Off, with the reason: the front-proxy CA is not trusted at all.
        assert cfg.requestheader_cas == () and cfg.requestheader_ca_pem == b""
        assert key in cfg.requestheader_error


@settings(max_examples=200, deadline=None)
@given(raw=st.text(max_size=30))
def test_any_text_for_allowed_names_is_a_valid_list_or_refused(
        module_certs: Pki, raw: str) -> None:
    cfg = parse_configmap(_data(module_certs, **{KEY: raw}))
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw  # not JSON: never a list
    assert bool(cfg.requestheader_cas) == _valid(value)
    # "Any name" (an empty allowed list with a trusted front-proxy CA) only from "[]".
    if cfg.requestheader_cas and not cfg.allowed_names:
        assert value == []


@pytest.mark.parametrize("raw", ["null", "{}", "5", '[""]', '"front-proxy-client"',
                                 "front-proxy-client", "", '["a", 1]', '[" "]'])
def test_malformed_allowed_names_turn_header_auth_off(module_certs: Pki, raw: str) -> None:
    cfg = parse_configmap(_data(module_certs, **{KEY: raw}))
    assert cfg.requestheader_cas == () and cfg.allowed_names == ()
    assert KEY in cfg.requestheader_error


def test_absent_or_empty_allowed_names_accept_any_front_proxy_name(module_certs: Pki) -> None:
    data = _data(module_certs)
    del data[KEY]
    for d in (data, _data(module_certs, **{KEY: "[]"})):
        cfg = parse_configmap(d)
        assert cfg.requestheader_cas and cfg.allowed_names == () and not cfg.requestheader_error


@pytest.mark.parametrize("raw", ["null", "{}", "5", '[""]'])
async def test_front_proxy_is_refused_while_allowed_names_is_malformed(
        server: Server, kube: FakeKube, raw: str, caplog: pytest.LogCaptureFixture) -> None:
    kube.sar_policy = lambda _spec: True
    cm = auth_configmap(server.certs)
    cm["data"][KEY] = raw
    with caplog.at_level(logging.ERROR, "aggapi.apiserver.authconfig"):
        kube.put("api/v1", "configmaps", cm)
        await until(lambda: any(KEY in r.getMessage() for r in caplog.records))
    assert "refused" in caplog.text
    for cn in (FRONT_PROXY_CN, "any-proxy-name"):
        cert = server.certs.client_pair(server.certs.front_proxy_ca, cn)
        async with server.session(cert).get(PROGRESS, headers={"X-Remote-User": "dave"}) as r:
            assert r.status == 401, (cn, await r.text())
    assert kube.sar_calls == []
    # Fixed: header authentication works again without a restart.
    kube.put("api/v1", "configmaps", auth_configmap(server.certs))
    sess = server.session(server.certs.client_pair(server.certs.front_proxy_ca,
                                                   FRONT_PROXY_CN))

    async def accepted() -> bool:
        try:
            async with sess.get(PROGRESS, headers={"X-Remote-User": "dave"}) as r:
                return r.status != 401
        except aiohttp.ClientError:
            return False
    await until(accepted)


def test_release_without_uid_headers_keeps_header_auth(module_certs: Pki) -> None:
    """kube-apiserver before 1.32 has no --requestheader-uid-headers and writes no such
    key (tests/e2e/test_controlplane.py sees it on v1.30): front-proxy authentication
    stays on, with users that simply carry no uid."""
    data = _data(module_certs)
    del data["requestheader-uid-headers"]
    cfg = parse_configmap(data)
    assert cfg.requestheader_cas and not cfg.requestheader_error
    assert cfg.uid_headers == ()
    assert cfg.username_headers == tuple(json.loads(data["requestheader-username-headers"]))


def test_release_without_uid_headers_is_named_in_the_log(
        module_certs: Pki, caplog: pytest.LogCaptureFixture) -> None:
    """The reduced form is said once per change of the ConfigMap, with what is missing and
    what aggapi does instead; a release that publishes the key gets no such line."""
    without = _data(module_certs)
    del without["requestheader-uid-headers"]
    assert parse_configmap(_data(module_certs)).notices == ()
    src = AuthConfigSource(cast(KubeClient, None))

    def apply(data: dict[str, str], rv: str) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, "aggapi.apiserver.authconfig"):
            asyncio.run(src._apply({"metadata": {"resourceVersion": rv}, "data": data}))
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    said = apply(without, "1")
    assert len(said) == 1 and "requestheader-uid-headers is not published" in said[0], said
    assert "without a UID" in said[0] and "extension-apiserver-authentication" in said[0]
    assert apply(without, "1") == []  # unchanged: not repeated
    assert apply(_data(module_certs), "2") == []
