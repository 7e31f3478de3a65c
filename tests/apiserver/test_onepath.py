"""One parse decides what is authorized and what is done (security finding 1).

aiohttp routes on the raw path; the authorization attributes once came from a
second parse of the decoded path, so ``web-0%2Fimagepullprogress`` was the pod
name to the router and two segments to the authorizer.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi import wire
from aggapi.wire import GROUP_VERSION_PATH as GV

from .onepath import NODE, Env, Spec

EXPLOIT = f"{GV}/namespaces/ns1/pods/web-0%2Fimagepullprogress/copy?path=/etc/shadow"


@pytest.fixture
def env() -> Iterator[tuple[asyncio.Runner, Env]]:
    # A runner of our own: hypothesis drives the examples synchronously.
    with asyncio.Runner() as runner:
        e = runner.run(Env.start())
        try:
            yield runner, e
        finally:
            runner.run(e.stop())


def test_encoded_slash_cannot_turn_a_copy_into_a_permitted_subresource(
        env: tuple[asyncio.Runner, Env]) -> None:
    runner, e = env
    # The view role: only `get pods/imagepullprogress`.
    e.api.allow = lambda spec: (spec["resourceAttributes"]["verb"],
                                spec["resourceAttributes"]["subresource"]) == (
        "get", "imagepullprogress")
    assert runner.run(e.send("GET", EXPLOIT)) == 400
    assert e.agent.calls == [] and e.api.pods_read == [] and e.api.sars == []
    # The same copy, spelled plainly, is refused by authorization.
    assert runner.run(e.send("GET", EXPLOIT.replace("%2F", "-"))) == 403
    assert e.agent.calls == []


def test_ambiguous_segments_are_refused_before_authentication() -> None:
    async def run() -> list[int]:
        e = await Env.start(anonymous_auth=False)  # any authentication work would 401
        try:
            return [await e.send("GET", EXPLOIT), await e.send("GET", f"{GV}/namespaces/ns1")]
        finally:
            await e.stop()

    assert asyncio.run(run()) == [400, 401]


SAFE = "abcXYZ019-_~!$&'()*+,;=:@"
ALPHABET = SAFE + ".%/ \x00é☃🙂\u200b"


def _encode(text: str, choices: list[int]) -> str:
    """Percent-encode ``text``: characters outside SAFE always, the rest when the
    matching choice says so (in upper or lower case hex)."""
    out = []
    for ch, choice in zip(text, choices + [0] * len(text), strict=False):
        if ch in SAFE and choice == 0:
            out.append(ch)
            continue
        quoted = urllib.parse.quote(ch, safe="")
        if quoted == ch:  # unreserved: quote() leaves it; spell it by hand
            quoted = "".join(f"%{b:02X}" for b in ch.encode())
        out.append(quoted.lower() if choice == 2 else quoted)
    return "".join(out)


@st.composite
def segments(draw: st.DrawFn) -> str:
    """A raw path segment: names, dots, encoded slashes and NULs, unicode."""
    special = st.sampled_from([".", "..", "%2e", "%2E%2e", ".%2E", "web-0%2Fimagepullprogress",
                               "a%2fb", "%00", "x%00y", "web-0", "ns1", "%ff", "a%2Fcopy", ""])
    text = st.text(ALPHABET, min_size=1, max_size=12)
    choice = st.lists(st.integers(0, 2), max_size=12)
    return draw(st.one_of(special, st.builds(_encode, text, choice)))


def _malformed(raw: str) -> bool:
    try:
        seg = urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        return True
    return "/" in seg or "\x00" in seg or seg in ("", ".", "..")


@dataclass(frozen=True)
class Req:
    method: str
    path: str
    segments: tuple[str, ...]  # the generated raw segments in it
    sub: str


@st.composite
def requests(draw: st.DrawFn) -> Req:
    method = draw(st.sampled_from(["GET", "HEAD", "POST"]))
    sub = draw(st.sampled_from(["copy", "imagepullprogress", "imagepulls"]))
    prefix = GV + draw(st.sampled_from(["", "/watch"]))
    if sub == "imagepulls":
        node = draw(segments())
        return Req(method, f"{GV}/nodes/{node}/imagepulls", (node,), sub)
    ns, name = draw(segments()), draw(segments())
    query = "?path=/etc/x" if sub == "copy" else ""
    return Req(method, f"{prefix}/namespaces/{ns}/pods/{name}/{sub}{query}", (ns, name), sub)


def _attrs(spec: Spec) -> tuple[str, str, str, str, str]:
    a = spec["resourceAttributes"]
    return a["verb"], a["group"], a["resource"], a["subresource"], f"{a['namespace']}/{a['name']}"


def test_what_is_authorized_is_what_is_executed(env: tuple[asyncio.Runner, Env]) -> None:
    runner, e = env

    @settings(max_examples=150, deadline=None)
    @given(req=requests())
    def check(req: Req) -> None:
        e.reset()
        status = runner.run(e.send(req.method, req.path))
        if any(_malformed(s) for s in req.segments):
            assert status == 400, (req, status)
            assert e.api.sars == [] and e.agent.calls == [] and e.hub.watched == []
            return
        executed = e.api.pods_read + e.hub.watched
        if not e.agent.calls and not executed:
            return  # not routed (404/405): no handler ran
        own = _attrs(e.api.sars[0])
        verb, group, resource, sub, obj = own
        expected_verb = "watch" if "/watch/" in req.path else (
            "create" if req.method == "POST" else "get")
        assert (verb, group, sub) == (expected_verb, wire.GROUP, req.sub)
        # Every check the layer made was about the very object that was acted on.
        assert {_attrs(s)[4] for s in e.api.sars} == {obj}
        if req.sub == "imagepulls":
            assert resource == "nodes" and e.api.nodes_listed in ([], [obj[1:]])
            assert [(c["node"], c["operation"]) for c in e.agent.calls] == [
                (obj[1:], wire.OP_NODE_PULLS)]
            return
        assert resource == "pods"
        assert {f"{ns}/{n}" for ns, n in executed} == {obj}
        calls = {(c["pod_namespace"], c["pod_name"], c["operation"]) for c in e.agent.calls}
        ns, name = obj.split("/", 1)
        if req.sub == "copy":
            assert calls == {(ns, name, wire.copy_operation(req.method))}
            if req.method == "POST":  # the exec check rode along with the upload
                assert ("create", "", "pods", "exec", obj) in {_attrs(s) for s in e.api.sars}
        else:
            assert req.method != "POST" and calls == {(ns, name, wire.OP_PROGRESS)}
        assert all(c["node"] == NODE for c in e.agent.calls)

    check()
