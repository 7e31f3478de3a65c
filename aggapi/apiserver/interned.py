"""Strings held once however many held objects repeat them. Parsed JSON holds a new
string for each occurrence (the parser shares keys within one document only): at
50,000 pods, the namespaces, nodes, labels, images, phases and times of the pods,
Events and PodImagePulls a replica holds are each a few strings, held 50,000 times.
Interned strings are freed as usual when the last holder goes."""

from __future__ import annotations

import sys
from typing import Any

INTERN_MAX = 253  # characters: a DNS name's bound; longer ones are not worth a lookup


def text(v: Any) -> Any:
    """``v`` interned if a short string, else as it is."""
    return sys.intern(v) if type(v) is str and len(v) <= INTERN_MAX else v


def tree(v: Any) -> Any:
    """``v`` with every short string in it interned, keys too (an object or a list:
    a new one; ``v`` is not changed)."""
    if type(v) is str:
        return sys.intern(v) if len(v) <= INTERN_MAX else v
    if isinstance(v, dict):
        return {text(k): tree(x) for k, x in v.items()}
    if isinstance(v, list):
        return [tree(x) for x in v]
    return v
