from __future__ import annotations

import pytest

from aggapi.apiserver.config import parse_args


def test_defaults() -> None:
    cfg = parse_args([], env={})
    assert (cfg.secure_port, cfg.authz_allow_ttl, cfg.anonymous_auth) == (8443, 10.0, True)


def test_env_fallback_and_flag_precedence() -> None:
    env = {"AGGAPI_SECURE_PORT": "9443", "AGGAPI_ALWAYS_ALLOW_METRICS": "true",
           "AGGAPI_AUTHZ_ALLOW_TTL": "3.5", "AGGAPI_ANONYMOUS_AUTH": "false"}
    cfg = parse_args(["--secure-port", "10443"], env=env)
    assert cfg.secure_port == 10443
    assert cfg.always_allow_metrics is True
    assert cfg.authz_allow_ttl == 3.5
    assert cfg.anonymous_auth is False
    assert parse_args(["--anonymous-auth"], env=env).anonymous_auth is True
    assert parse_args(["--anonymous-auth=false"], env={}).anonymous_auth is False


def test_bad_tls_version() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tls-min-version", "1.0"], env={})
