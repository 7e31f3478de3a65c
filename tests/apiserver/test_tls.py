"""TLS serving: rotation on disk, minimum version, client certificate checks."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import warnings

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization

from aggapi.tls import pki
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .conftest import PROGRESS, Server


async def _served_cert(server: Server, cafile: str) -> bytes | None:
    """The DER serving certificate a new connection gets, None if ``cafile`` rejects it."""
    ctx = ssl.create_default_context(cafile=cafile)
    port = int(server.url.rsplit(":", 1)[1])
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    except ssl.SSLCertVerificationError:
        return None
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return der


async def test_serving_cert_reloaded_on_change(server: Server) -> None:
    certs = server.certs
    assert await _served_cert(server, certs.path("serving-ca.crt")) is not None
    rotated_ca = pki.new_ca("rotated-ca")
    rotated_ca.write(certs.dir / "rotated-ca.crt", certs.dir / "rotated-ca.key")
    new = pki.issue(rotated_ca, "aggapi", ips=["127.0.0.1"], server=True)
    new.write(certs.path("tls.crt"), certs.path("tls.key"))

    async def rotated() -> bool:
        der = new.cert.public_bytes(serialization.Encoding.DER)
        return await _served_cert(server, certs.path("rotated-ca.crt")) == der
    await until(rotated)
    assert server.tls.reloads == 1
    # The old CA no longer verifies the new serving certificate.
    assert await _served_cert(server, certs.path("serving-ca.crt")) is None


async def test_half_written_rotation_keeps_serving(server: Server) -> None:
    certs = server.certs
    other = pki.issue(pki.new_ca("x"), "aggapi", ips=["127.0.0.1"], server=True)
    # New cert, old key: a mismatched pair must not replace the working one.
    pki.write_file(certs.path("tls.crt"), other.cert_pem)
    assert not await server.tls.check()
    assert await _served_cert(server, certs.path("serving-ca.crt")) is not None


async def test_tls_1_1_refused(server: Server) -> None:
    ctx = ssl.create_default_context(cafile=server.certs.path("serving-ca.crt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
        async with aiohttp.ClientSession() as s, s.get(server.url + "/healthz", ssl=ctx):
            pass


async def test_expired_client_cert_is_401(server: Server, kube: FakeKube) -> None:
    kube.sar_policy = lambda _spec: True
    # Valid until the moment it was issued (whole seconds): expired by the time it is used.
    expired = pki.issue(server.certs.client_ca, "carol", client=True, days=0)
    expired.write(server.certs.dir / "old.crt", server.certs.dir / "old.key")
    cert = (server.certs.path("old.crt"), server.certs.path("old.key"))
    async with server.session(cert).get(PROGRESS) as resp:
        assert resp.status == 401
    assert kube.sar_calls == []


async def test_server_only_cert_is_not_a_client_cert(server: Server, kube: FakeKube) -> None:
    kube.sar_policy = lambda _spec: True
    pair = pki.issue(server.certs.client_ca, "carol", server=True)
    pair.write(server.certs.dir / "srv.crt", server.certs.dir / "srv.key")
    sess = server.session((server.certs.path("srv.crt"), server.certs.path("srv.key")))
    async with sess.get(PROGRESS) as resp:
        assert resp.status == 401


def test_handshake_leaves_client_cert_checks_to_authentication(server: Server) -> None:
    # Otherwise an untrusted cert is a handshake failure, not a 401 (see tlsconfig).
    assert server.tls.accepts_any_client_cert
