"""HTTP byte ranges for resumable file downloads (RFC 9110 sections 14 and 13.1.5).

One range only (``bytes=N-``, ``bytes=N-M``, ``bytes=-K``); a multi-range or
non-bytes request is answered with the whole file, as RFC 9110 allows. If-Range
with a stale ETag also gets the whole file, so a changed file is never spliced
onto an old partial download.
"""

from __future__ import annotations

import os

from aggapi.status import StatusError


def etag(st: os.stat_result) -> str:
    return f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'


def parse_range(header: str | None, size: int, *, if_range: str | None = None,
                current_etag: str = "") -> tuple[int, int] | None:
    """(first, last) inclusive, or None for the whole file; 416 if unsatisfiable."""
    if not header:
        return None
    if if_range is not None and if_range.strip() != current_etag:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first_s, dash, last_s = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first_s == "":
            suffix = int(last_s)
            if suffix <= 0 or size == 0:
                raise _unsatisfiable(size)
            return max(0, size - suffix), size - 1
        first = int(first_s)
        last = int(last_s) if last_s else None
    except ValueError:
        return None
    if first < 0 or (last is not None and last < first):
        return None  # syntactically invalid: ignore the header
    if first >= size:
        raise _unsatisfiable(size)
    return first, size - 1 if last is None else min(last, size - 1)


def _unsatisfiable(size: int) -> StatusError:
    return StatusError(416, f"range not satisfiable: the file has {size} bytes",
                       headers={"Content-Range": f"bytes */{size}"})
