"""What Kubernetes itself says about a pod's image pulls: scheduling, kubelet events
and container statuses, reduced to one view per container.

The agent sees bytes; only Kubernetes sees kubelet's decisions (a pull started, a
pull failed with the registry's text, back-off). The apiserver merges both.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from aggapi.auth.capability import ContainerRef
from aggapi.kube.events import from_kubelet

# Kubelet's event reasons for image pulls (pkg/kubelet/events).
PULLING, PULLED, FAILED, BACKOFF = "Pulling", "Pulled", "Failed", "BackOff"
# Waiting reasons in container statuses that mean the pull failed.
PULL_ERROR_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                      "ErrImageNeverPull", "RegistryUnavailable", "SignatureValidationFailed"}

_FIELD_PATH = re.compile(r"^spec\.(initContainers|containers|ephemeralContainers)\{(.+)\}$")
_QUOTED = re.compile(r'"([^"]+)"')


# Failures kubelet never retries: the stream ends on them even while following.
PERMANENT_REASONS = {"InvalidImageName", "ErrImageNeverPull"}
# kubelet's image pull back-off (pkg/kubelet: backOffPeriod, MaxContainerBackOff):
# 10 s after the first failure, doubling per failure, at most 300 s.
BACKOFF_INITIAL, BACKOFF_MAX = 10, 300
# Events of one second sort in the order kubelet emits them within one attempt.
_RANK = {PULLING: 0, PULLED: 1, FAILED: 2, BACKOFF: 3}
# client-go names a new Event '<object>.<UnixNano in hex>' (tools/record makeEvent).
_COMBINED = "(combined from similar events): "
_NAME_NANOS = re.compile(r"\.([0-9a-f]{1,16})$")
# kubelet's 'Successfully pulled image "x" in 2.3s (4.1s including waiting)...': the
# first figure is the pull alone (from its slot on), a Go duration.
_PULLED_IN = re.compile(r'^Successfully pulled image "[^"]*" in ([0-9.hmsuµn]{1,32})(?: |$)')
_GO_DURATION = re.compile(r"(?:[0-9]{1,9}(?:\.[0-9]{1,9})?(?:h|ms|m|s|µs|us|ns))+")
_GO_UNIT = re.compile(r"([0-9.]+)(h|ms|m|s|µs|us|ns)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6,
                 "ns": 1e-9}
PULL_SECONDS_MAX = 86400.0  # a longer pull is not believed
# kubelet measures the pull before it makes the event (a channel hand-off, and the
# duration cut to milliseconds): the start is put this much earlier.
PULL_BEGAN_MARGIN = 0.05
# Distinct event times whose parse is remembered (a pure function of the string; a
# rollout's events share few seconds, and every build orders its pod's events).
SECONDS_CACHE = 4096


# Whose pull a view is: (CONTAINER, name) or (VOLUME, name). An image volume may share
# its name with a container (volume and container names are separate namespaces), and
# kubelet's events tell them apart: a container's name it in their fieldPath, an image
# volume's name only the pod (kuberuntime getImageVolumes passes the pod's reference).
CONTAINER, VOLUME = "container", "volume"
Who = tuple[str, str]
POD: Who = ("", "")  # the pod as a whole (pod granularity)


def who(c: ContainerRef) -> Who:
    return (VOLUME if c.kind == "imagevolume" else CONTAINER, c.name)


@dataclass(frozen=True, slots=True)
class K8sView:
    """Kubernetes' view of one container's image. (Slots: builds keep one per container
    of each pod version they remember, ``collections.kubepart``.)"""

    phase: str = ""          # "", Unscheduled, Pulling, Pulled, Failed, BackOff
    error: str = ""          # the registry's / kubelet's error text
    already_present: bool = False
    pulled_here: bool = False  # kubelet's Pulled event: it pulled the image for this pod
    # When that pull began (epoch seconds, the node's clock; pulled_here only): no later
    # than its first layer's commit, and no earlier than its wait for a pull slot.
    pull_began: float | None = None
    since: str = ""          # timestamp of the event that set the phase
    attempt: int = 0         # pulls kubelet started (see _attempt)
    failures: int = 0        # pulls that failed (its 'Failed to pull image' events)
    permanent: bool = False  # a failure kubelet will not retry

    @property
    def failed(self) -> bool:
        return self.phase in (FAILED, BACKOFF)

    @property
    def back_off_seconds(self) -> int | None:
        """kubelet's back-off after ``failures`` failed pulls (an estimate from its
        fixed schedule: the retry comes with the first pod sync after it)."""
        if not self.failed or self.permanent:
            return None
        n = max(self.failures, 1)
        return min(BACKOFF_INITIAL << min(n - 1, 16), BACKOFF_MAX)


# Kubernetes has said nothing of an image: one shared instance (frozen), as a default
# read several times per container and build.
NO_VIEW = K8sView()


def _count(ev: Mapping[str, Any]) -> int:
    """How many times kubelet emitted this (deduplicated) event."""
    n = (ev.get("series") or {}).get("count") or ev.get("count") or 1
    return n if isinstance(n, int) and n > 0 else 1


def _targets(ev: Mapping[str, Any], containers: Sequence[ContainerRef]) -> list[Who]:
    """Whose pull an event is about: the container its fieldPath names; without a
    fieldPath (image volumes), each image volume of the image its message names."""
    m = _FIELD_PATH.match((ev.get("involvedObject") or {}).get("fieldPath") or "")
    if m:
        return [(CONTAINER, m.group(2))] if any(
            c.name == m.group(2) and c.kind != "imagevolume" for c in containers) else []
    image = _image_of(ev)
    return [who(c) for c in containers if c.kind == "imagevolume" and c.image == image]


def _image_of(ev: Mapping[str, Any]) -> str | None:
    m = _QUOTED.search(ev.get("message") or "")
    return m.group(1) if m else None


def event_time(ev: Mapping[str, Any]) -> str:
    return str(ev.get("lastTimestamp") or ev.get("eventTime")
               or (ev.get("metadata") or {}).get("creationTimestamp") or "")


E = TypeVar("E", bound=Mapping[str, Any])


def kubelet_events(pod: Mapping[str, Any], events: Iterable[E]) -> list[E]:
    """The events that count for ``pod``, oldest first: kubelet's on the pod's node,
    about this pod (not an earlier one of the same name)."""
    uid = (pod.get("metadata") or {}).get("uid")
    node = (pod.get("spec") or {}).get("nodeName")
    evs = [e for e in events
           if (not uid or (e.get("involvedObject") or {}).get("uid") in (uid, None))
           and from_kubelet(e, node)]
    return sorted(evs, key=event_time) if len(evs) > 1 else evs


def _statuses(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    st = pod.get("status") or {}
    out: dict[str, Mapping[str, Any]] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in st.get(key) or ():
            out[cs.get("name", "")] = cs
    return out


def _subsecond(ev: Mapping[str, Any], when: str) -> float:
    """When in its second ``ev`` happened, from its name, or -1 when unknown: only an
    event seen once is at its name's time (a repeat moves lastTimestamp, not the
    name), and only when that time is in ``when``'s second."""
    if _count(ev) != 1 or not when.endswith("Z") or "." in when:
        return -1.0
    m = _NAME_NANOS.search(str((ev.get("metadata") or {}).get("name") or ""))
    if m is None:
        return -1.0
    second = _seconds(when)
    if second is None:
        return -1.0
    ns = int(m.group(1), 16)
    return (ns % 10**9) / 1e9 if ns // 10**9 == int(second) else -1.0


def _order(ev: Mapping[str, Any]) -> tuple[str, float, int]:
    """Oldest first. Times are whole seconds, and kubelet fails a pull and finds the
    image present on its retry (another pod pulled it) within one: the names' time
    orders those; the rank orders the rest (one attempt's events, repeats)."""
    when = event_time(ev)
    return (when, _subsecond(ev, when),
            _RANK.get(str(ev.get("reason") or ""), len(_RANK)))


def views(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]],
          containers: Sequence[ContainerRef]) -> dict[Who, K8sView]:
    """One K8sView per container and image volume (see ``who``), from the pod and its
    events (any order)."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return {who(c): K8sView(phase="Unscheduled") for c in containers}

    latest: dict[Who, K8sView] = {}
    attempts: dict[Who, int] = {}
    failures: dict[Who, int] = {}
    ordered = list(events)
    if len(ordered) > 1:  # (each key costs a time parse: one event needs none)
        ordered.sort(key=_order)
    for ev in ordered:
        reason = ev.get("reason") or ""
        if reason not in (PULLING, PULLED, FAILED, BACKOFF):
            continue
        message = _uncombined(str(ev.get("message") or ""))
        when = event_time(ev)
        for name in _targets(ev, containers):
            prev = latest.get(name)
            if reason == PULLING:
                attempts[name] = attempts.get(name, 0) + _count(ev)
                latest[name] = K8sView(phase=PULLING, since=when)
            elif reason == PULLED:
                present = "already present" in message
                latest[name] = K8sView(phase=PULLED, since=when, already_present=present,
                                       pulled_here=not present,
                                       pull_began=None if present else _pull_began(
                                           ev, message, when, prev))
            elif reason == FAILED and _pull_failure(message):
                # kubelet follows 'Failed to pull image "x": <registry text>' with a bare
                # 'Error: ErrImagePull': keep the registry's text, it is what users need.
                if not message.startswith("Error: "):
                    failures[name] = failures.get(name, 0) + _count(ev)
                keep = prev.error if prev and prev.error and message.startswith("Error: ") \
                    else ""
                phase = BACKOFF if "ImagePullBackOff" in message else FAILED
                latest[name] = K8sView(phase=phase, error=keep or _strip_prefix(message),
                                       since=when, permanent=any(
                                           r in message for r in PERMANENT_REASONS))
            elif reason == BACKOFF and "pull" in message.lower():
                latest[name] = K8sView(phase=BACKOFF, since=when,
                                       error=prev.error if prev and prev.error else message)

    # Container statuses tell the present, except that kubelet leaves the last
    # failure's waiting reason in place while it pulls again: a Pulling (or Pulled)
    # event newer than a failure event is the retry, and wins. (Image volumes have no
    # status of their own.)
    names = {c.name for c in containers if c.kind != "imagevolume"}
    for cname, cs in _statuses(pod).items():
        if cname not in names:
            continue
        name = (CONTAINER, cname)
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason") or ""
        prev = latest.get(name, NO_VIEW)
        if reason in PULL_ERROR_REASONS:
            retrying = prev.phase in (PULLING, PULLED) and failures.get(name, 0) > 0
            if retrying and reason not in PERMANENT_REASONS:
                continue
            if prev.failed and reason not in PERMANENT_REASONS:
                # The events say which step of the latest attempt kubelet is at; the
                # status, written on its own, may still be the attempt before's: its
                # ImagePullBackOff while the new attempt's Failed is in, or ErrImagePull
                # while its BackOff is.
                continue
            phase = BACKOFF if reason == "ImagePullBackOff" else FAILED
            latest[name] = K8sView(phase=phase, since=prev.since,
                                   error=prev.error or waiting.get("message") or reason,
                                   permanent=reason in PERMANENT_REASONS or prev.permanent)
        elif cs.get("imageID") and (prev.phase == "" or (
                prev.phase in (PULLING, FAILED, BACKOFF)
                and _started_since(state, prev.since))):
            # The image a container runs (or ran) is there; an older run's imageID
            # says nothing about a re-pull that began after it (imagePullPolicy Always).
            # A container started no earlier than a failure's event ran after that
            # failure's retry, whether or not the Pulled event came (kubelet's spam
            # filter drops events of a pod that failed often).
            latest[name] = K8sView(phase=PULLED, since=prev.since)
    return {name: _counted(v, attempts.get(name, 0), failures.get(name, 0))
            for name, v in latest.items()}


def _counted(v: K8sView, pulling: int, failures: int) -> K8sView:
    """``v`` with its attempts and failures (built whole: dataclasses.replace costs
    several times the constructor, once per container and build)."""
    return K8sView(phase=v.phase, error=v.error, already_present=v.already_present,
                   pulled_here=v.pulled_here, pull_began=v.pull_began, since=v.since,
                   attempt=_attempt(v, pulling, failures), failures=failures,
                   permanent=v.permanent)


def _attempt(v: K8sView, pulling: int, failures: int) -> int:
    """Pulls kubelet started: its Pulling events, counted, but never fewer than the
    failed pulls (plus the one under way since the last failure). Events go an hour
    after their last repeat (kube-apiserver's --event-ttl) and kubelet's spam filter
    drops repeats of a pod that fails often, so either count can fall short."""
    since_failure = 1 if failures and v.phase in (PULLING, PULLED) else 0
    return max(pulling, failures + since_failure)


@functools.lru_cache(maxsize=SECONDS_CACHE)
def _seconds(when: str) -> float | None:
    try:
        return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _go_seconds(text: str) -> float | None:
    """A Go duration as time.Duration prints it ('1m2.5s', '345ms'); None otherwise."""
    if not _GO_DURATION.fullmatch(text):
        return None
    total = sum(float(n) * _UNIT_SECONDS[u] for n, u in _GO_UNIT.findall(text))
    return total if total <= PULL_SECONDS_MAX else None


def _pull_began(ev: Mapping[str, Any], message: str, when: str, prev: K8sView | None
                ) -> float | None:
    """When the pull kubelet's ``Pulled`` event ``ev`` reports began: the event's time
    (within its second when client-go's name tells it, else the whole second, which is
    earlier) less the pull's duration; without a duration (kubelet before 1.25), the
    second of its ``Pulling`` event. None when neither is known."""
    m = _PULLED_IN.match(message)
    took = _go_seconds(m.group(1)) if m else None
    at = _seconds(when)
    if took is not None and at is not None:
        frac = _subsecond(ev, when)
        at = at + frac - took if frac >= 0 else int(at) - took
    elif m is None and prev is not None and prev.phase == PULLING:
        at = _seconds(prev.since)
        at = None if at is None else int(at)
    else:
        at = None
    return None if at is None or at <= PULL_BEGAN_MARGIN else at - PULL_BEGAN_MARGIN


def _started_since(state: Mapping[str, Any], since: str) -> bool:
    started = str(((state.get("running") or state.get("terminated") or {})
                   .get("startedAt")) or "")
    return bool(started) and started >= since


def _pull_failure(message: str) -> bool:
    """Whether a ``Failed`` event is about the image. kubelet uses the same reason for
    a container that fails to start ('Error: failed to create containerd task: ...'):
    a bare 'Error: X' counts only when X is one of kubelet's pull error reasons."""
    if message.startswith("Error: "):
        return message.removeprefix("Error: ").split(":", 1)[0].strip() in PULL_ERROR_REASONS
    return "pull" in message.lower()


def _uncombined(message: str) -> str:
    """client-go's aggregator prefixes the message of an event it combined from
    similar ones (same reason, 10 different messages in 10 minutes)."""
    return message.removeprefix(_COMBINED)


def _strip_prefix(message: str) -> str:
    """'Failed to pull image "x": rpc error: ...' -> the part after the image."""
    m = re.match(r'^Failed to pull image "[^"]*": (.*)$', message, re.S)
    return m.group(1) if m else message
