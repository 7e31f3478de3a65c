"""The compiled parts (setup.py; the image's compile stage), each optional: a module
that is not built leaves its Python path, the reference, and ``AGGAPI_PURE_PYTHON=1``
in the environment switches all of them off (an A/B, or a suspected compiled bug)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

ENV = "AGGAPI_PURE_PYTHON"


def switched_off() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def enabled(module: ModuleType | None) -> bool:
    """A compiled module is there (``optional``'s answer) and not switched off."""
    return module is not None and not switched_off()


def optional(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None where it is not built."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
