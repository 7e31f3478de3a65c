"""The client's first import, without the CA bundle aiohttp would load for nothing.

Importing aiohttp builds its two default SSL contexts, and each reads and parses
the system's CA bundle: about 60 ms of CPU apiece on the machines measured, a third
of a plugin's start-up. The plugins never use them: every https request carries the
context built from the kubeconfig (:func:`aggapi.kube.kubeconfig.ssl_context`, which
loads the system's trust itself when the kubeconfig names no CA; a plain http://
server needs none). So the plugins import the client with the default verify paths
skipped while aiohttp builds those two contexts: they trust no CA at all, so a
request that did use them would fail verification, never pass it. Only the import
is affected; every context made afterwards loads the defaults as usual.
"""

from __future__ import annotations

import ssl
import sys

_NAME = "set_default_verify_paths"


def import_client() -> None:
    """Import aiohttp (and so the client) without its default contexts' CA loading.
    Call it before anything imports aiohttp, with no other thread running."""
    if "aiohttp" in sys.modules:
        return
    cls = ssl.SSLContext
    own = cls.__dict__.get(_NAME)  # (None: inherited from _ssl._SSLContext)
    setattr(cls, _NAME, _skip)
    try:
        import aiohttp.connector  # noqa: F401
    finally:
        if own is None:
            delattr(cls, _NAME)
        else:
            setattr(cls, _NAME, own)


def _skip(self: ssl.SSLContext) -> None:
    """No default CA paths for the contexts aiohttp builds at import."""
