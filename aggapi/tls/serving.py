"""TLS serving with certificates reloaded from disk and client certificates requested.

kube-apiserver's model (Go's ``tls.RequestClientCert``): ask every client for a
certificate but let authentication, not the handshake, decide what it proves.
That is what makes a certificate from an unknown CA a 401 rather than a
handshake failure, and lets the trusted CA bundles change (the auth ConfigMap)
without touching TLS. Python's ssl cannot skip verification of a presented
client certificate, so we install an accept-all verify callback through libssl
with ctypes; if that is not possible we fall back to OpenSSL verification
against the client CA bundles given by :meth:`ServingTLS.set_client_cas`.

Serving certificates rotate on disk (cert-manager, kubelet-mounted secrets): a
poller notices mtime/size changes, builds a new SSLContext off the event loop
and an SNI callback swaps it into each new handshake; open connections keep
theirs.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import ssl
from collections.abc import Sequence

log = logging.getLogger(__name__)

_VERIFY_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


@_VERIFY_CB
def _accept_any(_preverify_ok: int, _store: int) -> int:
    return 1


def _load_libssl() -> ctypes.CDLL | None:
    """The libssl the ``_ssl`` module is linked to (found in our own mappings)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "/libssl.so" in path:
                    lib = ctypes.CDLL(path)
                    lib.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VERIFY_CB]
                    lib.SSL_CTX_set_verify.restype = None
                    lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
                    lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
                    return lib
    except (OSError, AttributeError):
        pass
    return None


_LIBSSL = _load_libssl()
_SSL_VERIFY_PEER = 0x01


def _install_accept_any(ctx: ssl.SSLContext) -> bool:
    """Request client certs without verifying them in the handshake.

    CPython's SSLContext object starts with ``PyObject_HEAD; SSL_CTX *ctx``. The
    pointer is sanity-checked against the verify mode Python itself set before it
    is written through.
    """
    if _LIBSSL is None:
        return False
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not ptr:
        return False
    ctx.verify_mode = ssl.CERT_OPTIONAL
    if _LIBSSL.SSL_CTX_get_verify_mode(ptr) != _SSL_VERIFY_PEER:
        return False
    ctx.verify_mode = ssl.CERT_NONE
    if _LIBSSL.SSL_CTX_get_verify_mode(ptr) != 0:
        return False
    _LIBSSL.SSL_CTX_set_verify(ptr, _SSL_VERIFY_PEER, _accept_any)
    return ctx.verify_mode == ssl.CERT_OPTIONAL


def _stamp(path: str) -> tuple[float, int, int]:
    st = os.stat(path)
    return (st.st_mtime, st.st_size, st.st_ino)


class ServingTLS:
    """The server's SSLContext, kept current with files on disk.

    Use :attr:`context` for the listening socket and run :meth:`run` as a task.
    """

    def __init__(self, cert_file: str, key_file: str, *,
                 min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
                 poll_interval: float = 1.0) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.min_version = min_version
        self.poll_interval = poll_interval
        self._client_cas: tuple[bytes, ...] = ()
        self._stamps = (_stamp(cert_file), _stamp(key_file))
        self._accepts_any = False
        self._current = self._build()
        self.reloads = 0
        # The listening context only dispatches each handshake to the current one.
        self.context = self._build()
        self.context.sni_callback = self._sni

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.set_alpn_protocols(["http/1.1"])
        if _install_accept_any(ctx):
            self._accepts_any = True
        else:
            # Fallback: OpenSSL verifies a presented cert against the known CAs.
            ctx.verify_mode = ssl.CERT_OPTIONAL
            for pem in self._client_cas:
                ctx.load_verify_locations(cadata=pem.decode())
        return ctx

    @property
    def accepts_any_client_cert(self) -> bool:
        return self._accepts_any

    def _sni(self, sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        sslobj.context = self._current

    async def set_client_cas(self, pems: Sequence[bytes]) -> None:
        """The CA bundles whose client certs authentication may accept (fallback
        mode needs them in the handshake; with the callback they are not used here)."""
        new = tuple(p for p in pems if p.strip())
        if new == self._client_cas:
            return
        self._client_cas = new
        if not self._accepts_any:
            self._current = await asyncio.to_thread(self._build)

    async def check(self) -> bool:
        """Reload if the files changed; True when a new context was swapped in."""
        try:
            stamps = await asyncio.to_thread(lambda: (_stamp(self.cert_file),
                                                      _stamp(self.key_file)))
        except OSError as exc:
            log.warning("serving cert files unreadable, keeping the current ones: %s", exc)
            return False
        if stamps == self._stamps:
            return False
        try:
            ctx = await asyncio.to_thread(self._build)
        except (OSError, ssl.SSLError, ValueError) as exc:
            # Mid-rotation (cert written, key not yet): retry on the next poll.
            log.warning("serving cert reload failed, keeping the current one: %s", exc)
            return False
        self._stamps = stamps
        self._current = ctx
        self.reloads += 1
        log.info("serving certificate reloaded", extra={"certFile": self.cert_file})
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            await self.check()
