"""The OpenAPI definitions of what this server sends (``openapi.py`` serves them).

Object metadata is the real ``ObjectMeta`` and ``ListMeta`` of meta.k8s.io/v1 under
kube's own definition names, written out here so that each document stands alone
(kubectl fetches the v3 document of one group-version and resolves every ``$ref`` in
it): `kubectl explain podimagepulls.metadata` lists its fields as it does for pods.
The field names and types are Kubernetes' (they are the wire format); the words
are ours. Every schema says exactly which keys a body carries (checked against
real responses by tests/apiserver/collections/test_openapi_bodies.py).
"""

from __future__ import annotations

from typing import Any

from aggapi import GROUP, VERSION
from aggapi.apiserver.discovery import (
    KIND_IMAGE_PULL_PROGRESS,
    KIND_NODE_IMAGE_PULL,
    KIND_NODE_IMAGE_PULLS,
    KIND_POD_IMAGE_PULL,
)

DEF = "io.aggapi.subresources.v1alpha1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
OBJECT_META, LIST_META = META + "ObjectMeta", META + "ListMeta"
STATUS, RESOURCE_LIST = META + "Status", META + "APIResourceList"

INT = {"type": "integer", "format": "int64"}
NUM = {"type": "number", "format": "double"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
NULLABLE = {"x-nullable": True}


def ref(name: str, description: str = "") -> dict[str, Any]:
    """A reference, described (v2 and v3 both ignore siblings of a bare $ref, so the
    description goes beside it in an allOf, as kube's documents do)."""
    if not description:
        return {"$ref": "#/definitions/" + name}
    return {"allOf": [{"$ref": "#/definitions/" + name}], "description": description}


def obj(description: str, props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"description": description, "type": "object", "properties": props, **extra}


def _strings(description: str) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": STR, "description": description}


def _time(description: str) -> dict[str, Any]:
    return ref(META + "Time", description)


def meta_schemas() -> dict[str, dict[str, Any]]:
    """ObjectMeta, ListMeta and the types they name."""
    return {
        META + "Time": {"type": "string", "format": "date-time",
                        "description": "An RFC 3339 time, to the second."},
        META + "FieldsV1": {"type": "object",
                            "description": "A set of fields, in the FieldsV1 format."},
        META + "ManagedFieldsEntry": obj("Which manager set which fields.", {
            "apiVersion": STR, "fieldsType": STR, "fieldsV1": ref(META + "FieldsV1"),
            "manager": STR, "operation": STR, "subresource": STR,
            "time": _time("when the manager last changed these fields")}),
        META + "OwnerReference": obj(
            "An object this one belongs to.", {
                "apiVersion": STR, "kind": STR, "name": STR, "uid": STR,
                "controller": BOOL, "blockOwnerDeletion": BOOL},
            required=["apiVersion", "kind", "name", "uid"]),
        OBJECT_META: obj("Standard object metadata. A PodImagePull carries its pod's "
                         "name, namespace, uid, creationTimestamp and labels; a "
                         "NodeImagePull its node's name.", {
            "name": {**STR, "description": "unique within its namespace"},
            "generateName": STR,
            "namespace": {**STR, "description": "the namespace; empty for cluster-scoped "
                          "objects"},
            "selfLink": STR,
            "uid": {**STR, "description": "unique in time and space"},
            "resourceVersion": {**STR, "description": "an opaque version of this object, "
                                "for watches"},
            "generation": INT,
            "creationTimestamp": _time("when the object was created"),
            "deletionTimestamp": _time("when the object will be deleted"),
            "deletionGracePeriodSeconds": INT,
            "labels": _strings("labels, for label selectors"),
            "annotations": _strings("annotations"),
            "ownerReferences": {"type": "array", "items": ref(META + "OwnerReference")},
            "finalizers": {"type": "array", "items": STR},
            "managedFields": {"type": "array", "items": ref(META + "ManagedFieldsEntry")}}),
        LIST_META: obj("Standard list metadata.", {
            "resourceVersion": {**STR, "description": "the list's version: watch from it"},
            "continue": {**STR, "description": "set when more items remain: pass it as "
                         "the continue parameter for the next page"},
            "remainingItemCount": {**INT, "description": "items left after this page, "
                                   "when known"},
            "selfLink": STR}),
        STATUS: obj("Status: the answer of a call that returns no other object "
                    "(errors, copy uploads).", {
            "apiVersion": STR, "kind": STR, "metadata": ref(LIST_META),
            "status": {**STR, "description": "Success or Failure"},
            "message": STR, "reason": STR, "code": {"type": "integer", "format": "int32"},
            "details": obj("What the status is about.", {
                "name": STR, "group": STR, "kind": STR, "uid": STR,
                "retryAfterSeconds": {"type": "integer", "format": "int32"},
                "causes": {"type": "array", "items": obj("One cause.", {
                    "reason": STR, "message": STR, "field": STR})}})}),
        RESOURCE_LIST: obj("The resources of a group-version.", {
            "apiVersion": STR, "kind": STR, "groupVersion": STR,
            "resources": {"type": "array", "items": {"type": "object"}}},
            required=["groupVersion", "resources"]),
    }


def gvk(kind: str) -> list[dict[str, str]]:
    return [{"group": GROUP, "version": VERSION, "kind": kind}]


_PHASES = ("Unscheduled, Pending, Pulling, Waiting (for a pull slot), Resolving, "
           "Downloading, Extracting, Done, AlreadyPresent, Failed, BackOff or Unknown")


def _pod_image_pull() -> dict[str, Any]:
    image = obj("One image of the pod.", {
        "container": {**STR, "description": "the container (or image volume) pulling it"},
        "image": {**STR, "description": "the image reference"},
        "phase": {**STR, "description": _PHASES},
        "progress": {**INT, **NULLABLE, "description": "bytes downloaded; null: unknown"},
        "total": {**INT, **NULLABLE, "description": "bytes to download (kept after Done); "
                  "null: unknown"},
        "bytesPerSecond": {**NUM, **NULLABLE, "description": "download rate"},
        "etaSeconds": {**NUM, **NULLABLE, "description": "estimated seconds left"},
        "attempt": {**INT, "description": "pulls of the image kubelet has started"},
        "waitingForSlot": {**BOOL, "description": "kubelet waits for one of the node's "
                           "pull slots (maxParallelImagePulls)"},
        "slots": obj("The node's pull slots while waiting.", {
            "used": {**INT, **NULLABLE}, "limit": {**INT, **NULLABLE}}),
        "reason": {**STR, "description": "why the pull is stuck (Failed/BackOff): "
                   "kubelet's or the registry's words"},
        "backOffSeconds": {**INT, "description": "kubelet's back-off before its next try"},
    })
    return {**obj("Image pulls of one pod, merged from its node's agent and kubelet's "
                  "events (read-only).", {
        "apiVersion": STR, "kind": STR, "metadata": ref(OBJECT_META),
        "spec": obj("Where the pod pulls.", {"nodeName": {
            **STR, "description": "the node the pod is bound to; empty: unscheduled"}}),
        "status": obj("The pod's pulls.", {
            "phase": {**STR, "description": "the images' phases summed up: a failure "
                      "first, then the most advanced activity"},
            "progress": {**INT, **NULLABLE, "description": "bytes downloaded, each image "
                         "once however many containers name it"},
            "total": {**INT, **NULLABLE, "description": "bytes to download, each image "
                      "once; 0 when every image was already present"},
            "bytesPerSecond": {**NUM, **NULLABLE}, "etaSeconds": {**NUM, **NULLABLE},
            "imagesPresent": {**INT, "description": "entries of images that are present"},
            "images": {"type": "array", "items": image}})}),
        "x-kubernetes-group-version-kind": gvk(KIND_POD_IMAGE_PULL)}


def _pull_status() -> dict[str, Any]:
    return obj("One in-flight pull.", {
        "images": {"type": "array", "items": STR},
        "repositories": {"type": "array", "items": STR},
        "phase": STR, "progress": {**INT, **NULLABLE},
        "total": {**INT, **NULLABLE}, "bytesPerSecond": {**NUM, **NULLABLE},
        "startedAt": STR})


def _node_image_pull() -> dict[str, Any]:
    return {**obj("Image pulls on one node (read-only; names every namespace's images).", {
        "apiVersion": STR, "kind": STR, "metadata": ref(OBJECT_META),
        "status": obj("The node's pulls.", {
            "pulling": {**INT, "description": "pulls in flight"},
            "slots": obj("kubelet's pull slots.", {
                "used": {**INT, **NULLABLE}, "limit": {**INT, **NULLABLE,
                                                       "description": "null: no limit"},
                "serialize": {**BOOL, **NULLABLE}}),
            "pulls": {"type": "array", "items": _pull_status()},
            "waitingPods": {"type": "array", "items": STR,
                            "description": "namespace/name of pods waiting for a slot"},
            "linkBytesPerSecond": {**NUM, **NULLABLE},
            "error": STR})}),
        "x-kubernetes-group-version-kind": gvk(KIND_NODE_IMAGE_PULL)}


def _node_image_pulls() -> dict[str, Any]:
    """nodes/{name}/imagepulls: the agent's node view, with the pods on the node that
    each pull brings images for."""
    pull = obj("One in-flight pull (one containerd lease).", {
        "lease": {**STR, "description": "the containerd lease of the pull"},
        "startedAt": {**STR, "description": "when the pull began (RFC 3339)"},
        "phase": {**STR, "description": "Resolving, Downloading, Extracting or Failed"},
        "repositories": {"type": "array", "items": STR,
                         "description": "host/repository of what it fetches"},
        "images": {"type": "array", "items": STR,
                   "description": "the image references it brings, once known"},
        "digest": {**STR, "description": "the root manifest digest; empty until fetched"},
        "progress": {**INT, **NULLABLE}, "total": {**INT, **NULLABLE},
        "bytesPerSecond": {**NUM, **NULLABLE},
        "etaSeconds": {**NUM, **NULLABLE,
                       "description": "seconds until its last byte, as the node plans its "
                                      "link; null while not known"},
        "downloadingLayers": {**INT, "description": "layers downloading now"},
        "pods": {"type": "array", "items": obj("A pod on the node whose image it brings.", {
            "namespace": STR, "name": STR, "container": STR, "image": STR})}})
    return {**obj("Image pulls in progress on a node, with kubelet's pull slots "
                  "(KEP-3673).", {
        "apiVersion": STR, "kind": STR, "metadata": ref(OBJECT_META),
        "node": {**STR, "description": "the node (as metadata.name)"},
        "backend": {**STR, "description": "containerd (bytes) or cri (phases only)"},
        "kubelet": obj("kubelet's pull settings as read from its configuration.", {
            "serializeImagePulls": {**BOOL, **NULLABLE},
            "maxParallelImagePulls": {**INT, **NULLABLE},
            "parallelSlots": {**INT, **NULLABLE}, "source": STR, "error": STR}),
        "slots": obj("kubelet's pull slots.", {
            "limit": {**INT, **NULLABLE, "description": "null: no limit, or (with error) "
                      "not known"},
            "serialize": {**BOOL, **NULLABLE}, "source": STR, "error": STR}),
        "inFlight": {**INT, **NULLABLE, "description": "pulls in flight; null: the "
                     "runtime cannot tell"},
        "pulls": {"type": "array", **NULLABLE, "items": pull},
        "slotsFree": {**INT, **NULLABLE},
        "presentImages": {"type": "array", **NULLABLE, "items": STR,
                          "description": "the image references on the node; null: the "
                          "runtime cannot list them"},
        "linkBytesPerSecond": {**NUM, **NULLABLE,
                               "description": "the node's download rate, all pulls"},
        "error": {**STR, "description": "why the runtime could not be read"},
        "time": {**STR, "description": "when the agent looked (RFC 3339)"}}),
        "x-kubernetes-group-version-kind": gvk(KIND_NODE_IMAGE_PULLS)}


def _progress() -> dict[str, Any]:
    return obj("Pull progress of a pod, one of its images, or one layer (KEP-5334). "
               "Streamed as a sequence of JSON objects.", {
        "image": {**STR, "description": "image reference; empty: whole pod"},
        "layer": {**STR, "description": "layer digest; empty: whole image"},
        "manifest": {**STR, "description": "a layer's: the digest of the manifest (or "
                     "index) it is a layer of"},
        "kind": {**STR, "description": "Progress; the stream's one final object is "
                 "Summary, Error or Timeout"},
        "phase": {**STR, "description": _PHASES},
        "progress": {**INT, **NULLABLE, "description": "bytes so far; null when not known"},
        "total": {**INT, **NULLABLE, "description": "bytes expected; null when not known"},
        "attempt": {"type": "integer", "format": "int32",
                    "description": "pulls of the image kubelet has started"},
        "error": STR,
        "container": {**STR, "description": "the container (or image volume); "
                      "empty: whole pod"},
        "bytesPerSecond": {**NUM, **NULLABLE}, "etaSeconds": {**NUM, **NULLABLE},
        "time": {**STR, "description": "when the agent looked (RFC 3339)"},
        "waiting": {"type": "object", "description": "Waiting: the node's pulls "
                    "holding the slots (inFlight, inFlightCount, limit, slots)"},
        "backOffSeconds": {**INT, "description": "BackOff: kubelet's back-off"},
        "complete": {**BOOL, "description": "Summary: every image is present"},
        "images": {"type": "array", "description": "Summary: each image's phase",
                   "items": obj("One image.", {"container": STR, "image": STR,
                                               "phase": STR})},
        "message": {**STR, "description": "Timeout: why the stream ended"},
        "resume": {**STR, "description": "Timeout: the path that follows on"}})


def schemas() -> dict[str, dict[str, Any]]:
    out = {**meta_schemas(), DEF + KIND_IMAGE_PULL_PROGRESS: _progress(),
           DEF + KIND_NODE_IMAGE_PULLS: _node_image_pulls(),
           DEF + KIND_POD_IMAGE_PULL: _pod_image_pull(),
           DEF + KIND_NODE_IMAGE_PULL: _node_image_pull()}
    for kind in (KIND_POD_IMAGE_PULL, KIND_NODE_IMAGE_PULL):
        out[DEF + kind + "List"] = {
            **obj(f"A list of {kind}.", {
                "apiVersion": STR, "kind": STR, "metadata": ref(LIST_META),
                "items": {"type": "array", "items": ref(DEF + kind)}},
                required=["items"]),
            "x-kubernetes-group-version-kind": gvk(kind + "List")}
    return out
