"""Verb and attribute derivation, as kube-apiserver's RequestInfoFactory."""

from __future__ import annotations

import pytest

from aggapi.apiserver.requestinfo import RequestInfo, parse
from aggapi.status import StatusError

G = "/apis/subresources.aggapi.io/v1alpha1"


@pytest.mark.parametrize(("method", "path", "query", "verb"), [
    ("GET", f"{G}/namespaces/n/pods/p/imagepullprogress", {}, "get"),
    ("HEAD", f"{G}/namespaces/n/pods/p/copy", {}, "get"),
    ("POST", f"{G}/namespaces/n/pods/p/copy", {}, "create"),
    ("PUT", f"{G}/namespaces/n/pods/p/copy", {}, "update"),
    ("PATCH", f"{G}/namespaces/n/pods/p/copy", {}, "patch"),
    ("DELETE", f"{G}/namespaces/n/pods/p", {}, "delete"),
    ("GET", f"{G}/watch/namespaces/n/pods/p/imagepullprogress", {}, "watch"),
    ("POST", f"{G}/watch/namespaces/n/pods/p/copy", {}, "watch"),
    # ?watch on a named object does not change the verb; on a collection it does.
    ("GET", f"{G}/namespaces/n/pods/p/imagepullprogress", {"watch": "true"}, "get"),
    ("GET", f"{G}/namespaces/n/pods", {}, "list"),
    ("GET", f"{G}/namespaces/n/pods", {"watch": "1"}, "watch"),
    # kube's boolean parameters: only "0" and "false" (any case) are false
    ("GET", f"{G}/namespaces/n/pods", {"watch": ""}, "watch"),
    ("GET", f"{G}/namespaces/n/pods", {"watch": "yes"}, "watch"),
    ("GET", f"{G}/namespaces/n/pods", {"watch": "False"}, "list"),
    ("GET", f"{G}/namespaces/n/pods", {"watch": "0"}, "list"),
    # A named object of a resource itself, served as a watch, is authorized as one.
    ("GET", f"{G}/namespaces/n/podimagepulls/p", {"watch": "1"}, "watch"),
    ("GET", f"{G}/namespaces/n/podimagepulls/p", {"watch": "false"}, "get"),
    ("GET", f"{G}/watch/namespaces/n/podimagepulls/p", {}, "watch"),
    ("DELETE", f"{G}/namespaces/n/pods", {}, "deletecollection"),
])
def test_verbs(method: str, path: str, query: dict[str, str], verb: str) -> None:
    assert parse(method, path, query).verb == verb


@pytest.mark.parametrize(("query", "name"), [
    ({"fieldSelector": "metadata.name=web-0"}, "web-0"),
    ({"fieldSelector": "spec.nodeName=n1,metadata.name==web-0", "watch": "true"}, "web-0"),
    ({"fieldSelector": "metadata.name!=web-0"}, ""),
    # kube's RequiresExactMatch: the first term (sorted); the two together match
    # nothing, so authorizing "a" allows nothing more than "a".
    ({"fieldSelector": "metadata.name=b,metadata.name=a"}, "a"),
    ({"fieldSelector": "spec.nodeName=n1"}, ""),
    ({"fieldSelector": r"metadata.name=a\,b"}, "a,b"),  # unescaped
    ({"fieldSelector": "metadata.name=a/b"}, ""),  # no path could name it
    ({"fieldSelector": "metadata.name=.."}, ""),
])
def test_list_of_one_name_is_authorized_for_it(query: dict[str, str], name: str) -> None:
    # As kube-apiserver's RequestInfoFactory: RBAC resourceNames then apply to it.
    info = parse("GET", f"{G}/namespaces/n/podimagepulls", query)
    assert (info.verb, info.name) == ("watch" if "watch" in query else "list", name)


def test_namespaced_subresource() -> None:
    assert parse("GET", f"{G}/watch/namespaces/n1/pods/p1/imagepullprogress") == RequestInfo(
        verb="watch", api_group="subresources.aggapi.io", api_version="v1alpha1",
        namespace="n1", resource="pods", subresource="imagepullprogress", name="p1",
        is_resource_request=True, path=f"{G}/watch/namespaces/n1/pods/p1/imagepullprogress")


def test_cluster_scoped_subresource() -> None:
    info = parse("GET", f"{G}/nodes/node-a/imagepulls")
    assert (info.namespace, info.resource, info.name, info.subresource) == (
        "", "nodes", "node-a", "imagepulls")


def test_core_group_and_namespace_object() -> None:
    info = parse("GET", "/api/v1/namespaces/n1")
    assert (info.api_group, info.api_version, info.resource, info.name) == (
        "", "v1", "namespaces", "n1")


@pytest.mark.parametrize("path", ["/apis", "/apis/subresources.aggapi.io", G, "/api",
                                  "/api/v1", "/healthz", "/metrics", "/openapi/v2"])
def test_non_resource(path: str) -> None:
    info = parse("GET", path)
    assert not info.is_resource_request and info.verb == "get" and info.path == path


@pytest.mark.parametrize("segment", ["web-0%2Fcopy", "a%2fb", "%00", "a%00", ".", "..", "%2e",
                                     "%2E%2e", ".%2e", "%ff", ""])
def test_ambiguous_segments_are_refused(segment: str) -> None:
    with pytest.raises(StatusError) as err:
        parse("GET", f"{G}/namespaces/n/pods/{segment}/copy")
    assert err.value.code == 400


def test_segments_are_decoded_one_by_one() -> None:
    info = parse("GET", f"{G}/namespaces/n%2Dx/pods/caf%C3%A9/imagepullprogress?x=%2F")
    assert (info.namespace, info.name, info.subresource) == ("n-x", "café",
                                                             "imagepullprogress")

