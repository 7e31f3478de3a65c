"""A collection request's list options, read and validated as kube-apiserver does
(k8s.io/apiserver's ListResource: decode, SetListOptionsDefaults with WatchList on,
ValidateListOptions): an undecodable value is 400, a forbidden combination 422
``Invalid`` with kube-apiserver's field errors, so clients and users recognise them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggapi.apiserver.collections.store import parse_rv
from aggapi.apiserver.requestinfo import flag
from aggapi.status import StatusError

EXACT, NOT_OLDER_THAN = "Exact", "NotOlderThan"
# kube-apiserver's --min-request-timeout default: a watch without timeoutSeconds (or
# with 0) lasts between one and two of it, at random, so watches do not end together.
MIN_REQUEST_TIMEOUT = 1800.0
_INT = re.compile(r"[+-]?[0-9]{1,18}")  # Go's ParseInt: no spaces, no underscores


@dataclass(frozen=True)
class ListOptions:
    watch: bool
    resource_version: str  # as given ("" when absent)
    rv: int | None  # parsed; None for "" and "0" (any version)
    match: str  # "", Exact or NotOlderThan (after kube's defaulting)
    send_initial: bool | None  # None: not given (and not defaulted)
    bookmarks: bool
    timeout_seconds: int | None  # None: absent or 0 (the server's default)

    def watch_seconds(self, min_request_timeout: float = MIN_REQUEST_TIMEOUT) -> float:
        """How long a watch lasts: timeoutSeconds, or min-request-timeout randomized
        as kube-apiserver does (a negative timeoutSeconds ends it at once)."""
        if self.timeout_seconds is None:
            return min_request_timeout * (1.0 + random.random())
        return float(self.timeout_seconds)


def _int(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None:
        return None
    if not _INT.fullmatch(raw):
        # kube-apiserver's decode error (strconv.ParseInt), a 400.
        raise StatusError(400, f'{name}: strconv.ParseInt: parsing "{raw}": '
                               "invalid syntax")
    return int(raw)


def _forbidden(field: str, detail: str) -> dict[str, str]:
    return {"type": "FieldValueForbidden", "field": field, "message": f"Forbidden: {detail}"}


def _not_supported(field: str, value: str, supported: tuple[str, ...]) -> dict[str, str]:
    values = ", ".join(f'"{v}"' for v in supported)
    return {"type": "FieldValueNotSupported", "field": field,
            "message": f'Unsupported value: "{value}": supported values: {values}'}


def invalid(causes: list[dict[str, str]]) -> StatusError:
    """kube-apiserver's errors.NewInvalid for ListOptions: 422 with every cause."""
    errs = [f"{c['field']}: {c['message']}" for c in causes]
    text = errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"
    details: dict[str, Any] = {"group": "meta.k8s.io", "kind": "ListOptions", "name": "",
                               "causes": causes}
    return StatusError(422, f'ListOptions.meta.k8s.io "" is invalid: {text}',
                       reason="Invalid", details=details)


def _validate(o: ListOptions, cont: str) -> list[dict[str, str]]:
    rvm, errs = "resourceVersionMatch", []
    if o.watch:
        if o.send_initial is not None and o.match != NOT_OLDER_THAN:
            errs.append(_forbidden(rvm, "sendInitialEvents requires setting "
                                        f"resourceVersionMatch to {NOT_OLDER_THAN}"))
        if o.match:
            if o.send_initial is None:
                errs.append(_forbidden(rvm, "resourceVersionMatch is forbidden for watch "
                                            "unless sendInitialEvents is provided"))
            if o.match != NOT_OLDER_THAN:
                errs.append(_not_supported(rvm, o.match, (NOT_OLDER_THAN,)))
            if cont:
                errs.append(_forbidden(rvm, "resourceVersionMatch is forbidden when "
                                            "continue is provided"))
        return errs
    if o.match:
        if not o.resource_version:
            errs.append(_forbidden(rvm, "resourceVersionMatch is forbidden unless "
                                        "resourceVersion is provided"))
        if cont:
            errs.append(_forbidden(rvm, "resourceVersionMatch is forbidden when continue "
                                        "is provided"))
        if o.match not in (EXACT, NOT_OLDER_THAN):
            errs.append(_not_supported(rvm, o.match, (EXACT, NOT_OLDER_THAN, "")))
        if o.match == EXACT and o.resource_version == "0":
            errs.append(_forbidden(rvm, 'resourceVersionMatch "exact" is forbidden for '
                                        'resourceVersion "0"'))
    if o.send_initial is not None:
        errs.append(_forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    return errs


def list_options(query: Mapping[str, str], *, watch: bool) -> ListOptions:
    """The request's options; 400 for an undecodable value, 422 for a combination
    kube-apiserver refuses."""
    timeout = _int(query, "timeoutSeconds")
    raw_rv = query.get("resourceVersion") or ""
    rv = parse_rv(raw_rv)
    match = query.get("resourceVersionMatch") or ""
    send = query.get("sendInitialEvents")
    send_initial = None if send is None else flag(send)
    # SetListOptionsDefaults: a watch from no particular version is a WatchList that
    # sends the state first (and ends it with the annotated bookmark, if allowed).
    if watch and send_initial is None and not match and raw_rv in ("", "0"):
        send_initial, match = True, NOT_OLDER_THAN
    opts = ListOptions(watch, raw_rv, rv, match, send_initial,
                       flag(query.get("allowWatchBookmarks")),
                       None if not timeout else timeout)
    if errs := _validate(opts, query.get("continue") or ""):
        raise invalid(errs)
    return opts
