"""Server-supplied text made safe for a terminal.

Registry and kubelet messages, image names and errors pass through the server
unchanged; any of them could carry escape sequences that move the cursor, rewrite
the title, hide text or (OSC 52) write the clipboard. Every control character goes:
C0 (tab and newline included: one object, one line), DEL and C1, and escape
sequences as a whole (CSI, OSC, DCS and the other string commands, and two-byte
escapes), 7-bit and 8-bit forms alike, so no parameter bytes are left behind.
"""

from __future__ import annotations

import re
from typing import Any

# ESC [ ... final | 8-bit CSI; ESC ] / P / X / ^ / _ ... up to BEL or ST (or the end)
# and their 8-bit forms; ESC followed by any one character.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[\x20-\x3f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """``text`` without escape sequences and control characters."""
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))


def clean_obj(obj: Any) -> Any:
    """A copy of a decoded JSON value with every string (keys too) cleaned."""
    if isinstance(obj, str):
        return clean(obj)
    if isinstance(obj, dict):
        return {clean(str(k)): clean_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_obj(v) for v in obj]
    return obj
