"""The plugin's pull views fed the objects the server really sends.

The Waiting object is built by the code that produces it: the agent's own
nodes/imagepulls handler (real kubelet config file, a scripted poll of one pull in
flight) gives the node view, and the apiserver's Merger turns an agent object into
what a client receives. A change of either shape changes this fixture with it.
"""

from __future__ import annotations

import inspect
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from aggapi.agent.kubeletconfig import KubeletConfigReader
from aggapi.agent.progress.handlers import ProgressHandlers
from aggapi.agent.progress.model import NodeState, PullState
from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.auth.capability import ContainerRef
from aggapi.plugins.render import PlainPullView, RichPullView, phase_text
from aggapi.plugins.sanitize import clean, clean_obj

IMG = "reg.example/team-b/web:1"
OTHER = "reg.example/team-a/payroll:3"


class _OnePull:
    """The poller's one-shot poll: one pull (another pod's) in flight."""

    async def observe_once(self, images: Any = ()) -> NodeState:
        pull = PullState(lease="l1", started_at=1.0e9, phase="Downloading",
                         repositories=("reg.example/team-a/payroll",), images=(OTHER,),
                         progress=10, total=100)
        return NodeState("containerd", {}, (pull,), time=1.0e9)

    @property
    def backend(self) -> _OnePull:  # the node's image records: none (presentImages)
        return self

    async def present_images(self) -> tuple[str, ...] | None:
        return None


async def node_view(tmp_path: Path, config: str) -> dict[str, Any]:
    path = tmp_path / "kubelet.yaml"
    path.write_text(config)
    # Readers that also look for a running kubelet's flags get an empty /proc: the
    # test's file is the whole configuration, whatever runs on this machine.
    proc = tmp_path / "proc"
    proc.mkdir()
    extra = ({"proc": str(proc)}
             if "proc" in inspect.signature(KubeletConfigReader).parameters else {})
    handlers = ProgressHandlers(_OnePull(), KubeletConfigReader(str(path), **extra),  # type: ignore[arg-type]
                                "node-a")
    resp = await handlers.imagepulls(make_mocked_request("GET", "/v1/imagepulls"))
    body: dict[str, Any] = json.loads(resp.body)  # type: ignore[arg-type]
    return body


def server_object(view: dict[str, Any], *, see_node_pulls: bool = False) -> dict[str, Any]:
    m = Merger((ContainerRef("app", IMG),), see_node_pulls=see_node_pulls)
    pod = {"spec": {"nodeName": "node-a"}, "status": {}}
    m.update(pod, [{"reason": "Pulling", "message": f'Pulling image "{IMG}"',
                    "lastTimestamp": "2026-01-01T00:00:01Z",
                    "involvedObject": {"fieldPath": "spec.containers{app}"}}])
    m.node_view = view
    return m.apply({"kind": "Progress", "container": "app", "image": IMG, "layer": "",
                    "phase": "Waiting", "progress": -1, "total": -1, "error": "",
                    "bytesPerSecond": None, "etaSeconds": None,
                    "time": "2026-01-01T00:00:02.000Z"})


SERIAL = ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
          "serializeImagePulls: true\n")


def plain(*objs: dict[str, Any], granularity: str = "image") -> str:
    out, err = io.StringIO(), io.StringIO()
    view = PlainPullView(granularity, out, err)
    for o in objs:
        view.update(o)
    return out.getvalue() + err.getvalue()


async def test_slots_render_from_the_real_server_object(tmp_path: Path) -> None:
    """At 622964a this printed "1/{'serializeImagePulls': True, ...} in use"."""
    obj = server_object(await node_view(tmp_path, SERIAL))
    assert obj["phase"] == "Waiting"
    assert phase_text(obj) == "Waiting for a pull slot (1/1 in use)"
    line = plain(obj)
    assert "{" not in line and "Waiting for a pull slot (1/1 in use)" in line
    buf = io.StringIO()
    rich = RichPullView("image", Console(file=buf, force_terminal=True, width=200))
    rich.update(obj)
    rich.close()
    assert "(1/1 in use)" in buf.getvalue()


async def test_other_pods_pulls_are_counted_in_the_text(tmp_path: Path) -> None:
    view = await node_view(tmp_path, SERIAL)
    assert phase_text(server_object(view, see_node_pulls=True)) == \
        "Waiting for a pull slot (1/1 in use)"
    # hidden from this caller: a count, still the same text (no "of other pods"
    # when none of them is listed)
    assert server_object(view)["waiting"]["inFlight"] == []
    assert phase_text(server_object(view)) == "Waiting for a pull slot (1/1 in use)"


@pytest.mark.parametrize(("waiting", "text"), [
    # the agent's coming shape, normalised by the server
    ({"inFlight": [], "inFlightCount": 2, "limit": 2,
      "slots": {"limit": 2, "serialize": False, "source": "f", "error": ""}}, "2/2 in use"),
    # unknown limit: said so, with the reason
    ({"inFlight": [], "inFlightCount": 1, "limit": None,
      "slots": {"limit": None, "serialize": None, "source": "f", "error": "unreadable"}},
     "1 in flight; limit unknown: unreadable"),
    # servers at 622964a: limit was the kubelet member, inFlight the full list
    ({"inFlight": [{"images": ["x"]}], "inFlightCount": 1,
      "limit": {"serializeImagePulls": True, "maxParallelImagePulls": None,
                "parallelSlots": 1, "source": "f", "error": ""}}, "1/1 in use"),
    ({"inFlight": [{"images": ["x"]}], "inFlightCount": 3, "limit": 3},
     "3/3 in use, 2 of other pods"),
])
def test_slot_shapes(waiting: dict[str, Any], text: str) -> None:
    assert phase_text({"phase": "Waiting", "waiting": waiting}) == \
        f"Waiting for a pull slot ({text})"


def test_backoff_shows_attempt_and_retry() -> None:
    o = {"kind": "Progress", "container": "app", "image": IMG, "layer": "", "phase": "BackOff",
         "progress": None, "total": None, "error": "manifest unknown", "attempt": 2,
         "backOffSeconds": 20}
    assert phase_text(o) == "BackOff (attempt 2, retry in ~20s): manifest unknown"


@pytest.mark.parametrize("unknown", [None, -1])
def test_unknown_sizes_null_or_minus_one(unknown: int | None) -> None:
    o = {"kind": "Progress", "container": "app", "image": IMG, "layer": "",
         "phase": "Resolving", "progress": unknown, "total": unknown, "error": "",
         "bytesPerSecond": None, "etaSeconds": None}
    assert "Resolving  -  -  -  ETA -" in plain(o)
    buf = io.StringIO()
    rich = RichPullView("layer", Console(file=buf, force_terminal=True, width=200))
    rich.update(o)
    rich.update({"kind": "Summary", "phase": "Done", "progress": unknown, "total": unknown,
                 "images": []})
    rich.close()
    assert rich.progress.tasks[0].percentage == 100  # the aggregate (first row) ends at 100%


def test_each_layer_shows_its_own_eta() -> None:
    def layer(d: str, eta: float) -> dict[str, Any]:
        return {"kind": "Progress", "container": "app", "image": IMG, "layer": d,
                "phase": "Downloading", "progress": 10, "total": 100, "error": "",
                "bytesPerSecond": 1000.0, "etaSeconds": eta}
    out = plain(layer("sha256:aaaa", 5), layer("sha256:bbbb", 65), granularity="layer")
    assert "aaaa  Downloading" in out and "ETA 0:00:05" in out and "ETA 0:01:05" in out
    buf = io.StringIO()
    rich = RichPullView("layer", Console(file=buf, force_terminal=True, width=200))
    rich.update(layer("sha256:aaaa", 5))
    rich.update(layer("sha256:bbbb", 65))
    rich.close()
    assert "ETA 0:00:05" in buf.getvalue() and "ETA 0:01:05" in buf.getvalue()


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Text made of anything, with escape sequences and their pieces over-represented.
NASTY = st.lists(st.one_of(
    st.characters(), st.sampled_from(["\x1b", "\x9b", "\x9d", "\x07", "[", "]", ";", "\\",
                                      "\n", "\r", "\t", "\x00", "\x7f", "2J", "0;title"])),
    max_size=40).map("".join)


@given(NASTY)
def test_clean_leaves_no_control_character(text: str) -> None:
    out = clean(text)
    assert not CONTROL.search(out)
    assert clean(out) == out
    # printable text passes unchanged
    printable = CONTROL.sub("", text).replace("\x1b", "")
    if not any(c in text for c in "\x1b\x9b\x90\x98\x9d\x9e\x9f"):
        assert out == printable


def test_escape_sequences_go_whole() -> None:
    assert clean("a\x1b[31;1mred\x1b[0m b") == "ared b"
    assert clean("x\x1b]0;owned\x07y") == "xy"
    assert clean("x\x1b]52;c;ZXZpbA==\x1b\\y") == "xy"  # OSC 52 clipboard write
    assert clean("x\x9b2Jy") == "xy"


@given(NASTY, NASTY, NASTY)
def test_views_print_no_control_character(image: str, error: str, layer: str) -> None:
    """Server text (image names, registry and kubelet messages) reaches the terminal
    cleaned, whichever view and phase carries it."""
    objs: list[dict[str, Any]] = [
        {"kind": "Progress", "container": "app", "image": image, "layer": layer,
         "phase": "BackOff", "progress": 1, "total": 2, "error": error, "attempt": 1,
         "backOffSeconds": 10},
        {"kind": "Progress", "container": "app", "image": image, "layer": "", "phase": "Waiting",
         "progress": None, "total": None, "error": "",
         "waiting": {"inFlight": [], "inFlightCount": 1, "limit": None,
                     "slots": {"limit": None, "error": error}}},
        {"kind": "Summary", "phase": error, "images": [{"container": "app", "image": image,
                                                        "phase": error}]},
        {"kind": "Error", "error": error, "image": image},
    ]
    text = plain(*objs, granularity="layer")
    assert not CONTROL.search(text.replace("\n", ""))
    buf = io.StringIO()
    # no terminal: rich writes no escape codes of its own, so any would be the server's
    rich = RichPullView("layer", Console(file=buf, force_terminal=False, width=200))
    for o in objs:
        rich.update(o)  # markup-like names ("[/]") must not raise either
    rich.close()
    assert not CONTROL.search(buf.getvalue().replace("\n", ""))
    assert clean_obj(objs) == clean_obj(clean_obj(objs))
