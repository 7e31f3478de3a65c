"""What the shared event informers keep of a kubelet pull Event: the fields read here,
nothing else (as ``podslim`` for pods, client-go's SetTransform).

Every pod's pull Events are held for as long as a source runs (the leader's term, and
a successor's warm feed beside its mirror): at 50,000 pods, 75,000 Events without
their managedFields took 200 MiB of Python objects (2.8 KiB each: the apiVersion and
kind, uid, resourceVersion, firstTimestamp, type, the involved object's apiVersion,
kind and resourceVersion, each a string of its own). Readers:
``pullstate.kubelet_events``/``views`` (reason, message, count, series.count,
lastTimestamp, eventTime, metadata.creationTimestamp and name, involvedObject's uid
and fieldPath), ``kube.events.from_kubelet`` (source, reportingComponent,
reportingInstance), ``podsources`` (metadata's and involvedObject's name and
namespace: the informer's key and the pod's index), ``collections.kubepart`` (an
Event's namespace, name and resourceVersion: what a remembered build is keyed by)
and ``collections.feeds`` (the resourceVersion: a rebuild of every pod starts with
the newest changes).

The strings many Events repeat (namespaces, reasons, nodes, times, field paths) are
held once (``interned``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggapi.apiserver import interned

TOP = ("reason", "message", "count", "lastTimestamp", "eventTime",
       "reportingComponent", "reportingInstance")
META = ("name", "namespace", "resourceVersion", "creationTimestamp")
INVOLVED = ("name", "namespace", "uid", "fieldPath")
SOURCE = ("component", "host")
SERIES = ("count",)
# Interned (repeated across Events); never the unique ones (names, uids, messages).
SHARED = frozenset({"namespace", "reason", "fieldPath", "component", "host",
                    "reportingComponent", "reportingInstance", "lastTimestamp",
                    "eventTime", "creationTimestamp"})


def _pick(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: interned.text(obj[k]) if k in SHARED else obj[k] for k in keys if k in obj}


def slim_event(ev: Mapping[str, Any]) -> dict[str, Any]:
    """``ev`` with only the fields read here (a new dict; ``ev`` is not changed). A
    nested field that is not an object is kept as it is (the readers cope with it)."""
    out = _pick(ev, TOP)
    for key, keys in (("metadata", META), ("involvedObject", INVOLVED),
                      ("source", SOURCE), ("series", SERIES)):
        if key in ev:
            inner = ev[key]
            out[key] = _pick(inner, keys) if isinstance(inner, Mapping) else inner
    return out
