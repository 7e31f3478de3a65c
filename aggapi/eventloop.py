"""The event loop our processes run on: uvloop when installed, else asyncio's own.

uvloop's TLS and socket paths are several times faster than the stdlib loop's,
which is what bounds copy throughput and how many streams one replica carries.
``AGGAPI_EVENT_LOOP=asyncio`` forces the stdlib loop (for debugging, or to compare).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    if os.environ.get("AGGAPI_EVENT_LOOP", "auto") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
