"""``limit`` and ``continue`` on a collection list, as kube-apiserver pages.

A page is at most ``limit`` objects in (namespace, name) order. When more follow, the
list's ``metadata.continue`` is an opaque token (base64 JSON: the first page's version
and the last key served) and ``remainingItemCount`` counts the rest (only without
selectors, as kube-apiserver). Every page of one list shows the state at the first
page's version: the first page's state is kept for the later ones
(``Collection.keep_state``; bounded in count and time), else rebuilt from the current
objects with the changes made since undone (``Collection.state_at``), as long as the
history covers that version; after that the token is 410 Expired and the client lists
again. The first page sorts the selection (off the event loop when it is big) and keeps
it beside the state: a later page is a bisect and a slice, not another sort.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggapi.apiserver.collections.store import Collection, Obj
from aggapi.status import StatusError

TOKEN_VERSION = "aggapi.io/v1"
MAX_TOKEN = 4096  # bytes of a continue token: names are at most 253 characters each
# kube-apiserver's words (k8s.io/apiserver storage/etcd3), so users recognise them.
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter.")

Key = tuple[str, str]


def object_key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


@dataclass(frozen=True)
class PageRequest:
    limit: int  # 0: no limit
    rv: int | None  # the version every page shows (a continued list's first page's)
    after: Key | None  # the last key of the page before


@dataclass(frozen=True)
class Page:
    items: list[Obj]
    rv: int
    cont: str  # "" when this is the last page
    remaining: int | None


def encode_token(rv: int, after: Key) -> str:
    raw = json.dumps({"v": TOKEN_VERSION, "rv": rv, "start": list(after)},
                     separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_token(token: str) -> tuple[int, Key]:
    """The version and last key in a continue token; 400 for anything else."""
    def bad(why: str) -> StatusError:
        return StatusError(400, f"continue key is not valid: {why}")
    if len(token) > MAX_TOKEN:
        raise bad("too long")
    try:
        body = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
        raise bad("not a continue token") from None
    if not isinstance(body, dict) or body.get("v") != TOKEN_VERSION:
        raise bad("incorrect encoded start resourceVersion (version aggapi.io/v1 required)")
    rv, start = body.get("rv"), body.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv <= 0:
        raise bad("incorrect encoded start resourceVersion")
    if not (isinstance(start, list) and len(start) == 2
            and all(isinstance(s, str) for s in start)):
        raise bad("incorrect encoded start key")
    return rv, (start[0], start[1])


def page_request(query: Mapping[str, str], rv: int | None) -> PageRequest:
    """``limit`` and ``continue`` from the query; ``rv`` is the list's resourceVersion."""
    raw = query.get("limit") or ""
    try:
        limit = int(raw) if raw else 0
    except ValueError:
        raise StatusError(400, f"limit must be an integer, got {raw!r}") from None
    limit = max(limit, 0)  # kube-apiserver: zero or negative means no limit
    token = query.get("continue") or ""
    if not token:
        return PageRequest(limit, None, None)
    if rv is not None:
        raise StatusError(400, "specifying resource version is not allowed when using "
                               "continue")
    cont_rv, after = decode_token(token)
    return PageRequest(limit, cont_rv, after)


def state_of(col: Collection, req: PageRequest) -> tuple[Mapping[Hashable, Obj], int | None]:
    """The objects a page is cut from and their version (None: now)."""
    if req.rv is None:
        return col.objects, None
    try:
        return col.state_at(req.rv), req.rv
    except StatusError as err:
        if err.code != 410:
            raise
        raise StatusError(410, EXPIRED_CONTINUE, reason="Expired") from None


def order(objs: Iterable[Obj], matches: Callable[[Obj], bool]) -> list[Obj]:
    """The objects ``matches`` selects, in page order: (namespace, name)."""
    return sorted((o for o in objs if matches(o)), key=object_key)


def cut(selected: Sequence[Obj], req: PageRequest, rv: int, *,
        count_remaining: bool) -> Page:
    """The page that ``req`` asks for of ``selected`` (a state at ``rv``, in page
    order): a bisect to the token's key, then at most ``limit`` objects."""
    start = 0 if req.after is None else bisect.bisect_right(selected, req.after,
                                                            key=object_key)
    end = len(selected) if not req.limit else min(start + req.limit, len(selected))
    items = list(selected[start:end])
    if end == len(selected):
        return Page(items, rv, "", None)
    remaining = len(selected) - end if count_remaining else None
    return Page(items, rv, encode_token(rv, object_key(items[-1])), remaining)


def list_meta(page: Page) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(page.rv)}
    if page.cont:
        meta["continue"] = page.cont
        if page.remaining is not None:
            meta["remainingItemCount"] = page.remaining
    return meta
