"""aiohttp, imported without reading the system's CA bundle on the way.

Importing ``aiohttp.connector`` builds two default TLS contexts, and each reads the
system trust store: about 50 ms of CPU of every kubectl plugin run here (a third of
aiohttp's import), for contexts the client never uses. Every https connection of
:mod:`aggapi.client.connection` carries the context built from the kubeconfig: its CA
alone, or the system store when it names none. So during that import the store
OpenSSL would read is an empty one, and aiohttp's own defaults trust nothing: should
anything ever connect with them, verification fails rather than passes. The user's
SSL_CERT_FILE/SSL_CERT_DIR are put back at once, for the contexts made afterwards and
for exec credential plugins. Imported first by :mod:`aggapi.client`; a process that
imported aiohttp before keeps aiohttp's defaults as they are.
"""

from __future__ import annotations

import os
import sys

_STORE_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR")


def _import_without_trust_store() -> None:
    if "aiohttp.connector" in sys.modules:
        return
    saved = {k: os.environ.get(k) for k in _STORE_VARS}
    os.environ.update(dict.fromkeys(_STORE_VARS, os.devnull))
    try:
        import aiohttp.connector  # noqa: F401
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_import_without_trust_store()
