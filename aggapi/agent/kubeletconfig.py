"""Kubelet's image-pull limits (KEP-3673), as the running kubelet sees them.

Kubelet's own precedence: its defaults (``serializeImagePulls: true``,
``maxParallelImagePulls`` unset), then its ``--config`` file, then the drop-ins of its
``--config-dir`` (files ending ``.conf``, in lexical order, each overriding the fields
it sets; kubelet 1.30+), then its command-line flags ``--serialize-image-pulls`` and
``--max-parallel-image-pulls``. The agent runs with hostPID: it finds the kubelet in
/proc, reads its flags from ``/proc/<pid>/cmdline`` and its files through
``/proc/<pid>/root``. Without a kubelet process to read, it reads the configured file.

A config that cannot be read gives no limit (None) and the reason: one slot reported
as fact would show every pull behind the first as waiting for a slot.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

DEFAULT_PATH = "/var/lib/kubelet/config.yaml"
PROC = "/proc"
_PROC_ROOT = re.compile(r"^/proc/(\d+|self)/root(?=/)")


@dataclass(frozen=True)
class PullLimits:
    serialize_image_pulls: bool | None = True  # None: not known
    max_parallel_image_pulls: int | None = None
    source: str = ""
    error: str = ""  # why the config could not be read (the limits are unknown then)

    @property
    def known(self) -> bool:
        return self.serialize_image_pulls is not None

    @property
    def parallel_slots(self) -> int | None:
        """How many pulls kubelet runs at once; None = unlimited, or not known (see
        ``known``)."""
        if self.serialize_image_pulls is None:
            return None
        if self.serialize_image_pulls:
            return 1
        return self.max_parallel_image_pulls or None

    def to_json(self) -> dict[str, Any]:
        return {"serializeImagePulls": self.serialize_image_pulls,
                "maxParallelImagePulls": self.max_parallel_image_pulls,
                "parallelSlots": self.parallel_slots, "source": self.source,
                "error": self.error}

    def slots_json(self) -> dict[str, Any]:
        """The node view's ``slots``: limit null with an empty error means unlimited;
        with an error, not known."""
        return {"limit": self.parallel_slots, "serialize": self.serialize_image_pulls,
                "source": self.source, "error": self.error}


def unknown(source: str, error: str) -> PullLimits:
    return PullLimits(None, None, source, error)


def _load(text: str) -> dict[str, Any]:
    """A KubeletConfiguration in YAML or JSON (JSON is YAML, but try it first: it is
    exact and faster)."""
    try:
        doc: Any = json.loads(text)
    except ValueError:
        doc = yaml.safe_load(text)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError("kubelet config is not a mapping")
    return doc


def _apply(limits: PullLimits, doc: dict[str, Any]) -> PullLimits:
    """The fields ``doc`` sets override ``limits``."""
    if "serializeImagePulls" in doc:
        serialize = doc["serializeImagePulls"]
        if not isinstance(serialize, bool):
            raise ValueError("serializeImagePulls must be a boolean")
        limits = replace(limits, serialize_image_pulls=serialize)
    if "maxParallelImagePulls" in doc:
        mp = doc["maxParallelImagePulls"]
        if mp is not None and (isinstance(mp, bool) or not isinstance(mp, int) or mp < 1):
            raise ValueError("maxParallelImagePulls must be a positive integer")
        limits = replace(limits, max_parallel_image_pulls=mp)
    return limits


def parse(text: str, source: str = "") -> PullLimits:
    """One KubeletConfiguration over kubelet's defaults."""
    return _apply(PullLimits(source=source), _load(text))


BOOL_FLAGS = frozenset({"serialize-image-pulls", "fail-swap-on", "register-node",
                        "register-schedulable", "help", "version"})


@dataclass(frozen=True)
class KubeletProcess:
    pid: int
    flags: dict[str, str]  # --name -> value ("true" for a bare boolean flag)

    @property
    def root(self) -> str:
        return f"{PROC}/{self.pid}/root"


def parse_flags(argv: Sequence[str]) -> dict[str, str]:
    """Kubelet's long flags (pflag: --name=value, --name value, or a bare boolean)."""
    out: dict[str, str] = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--") or arg == "--":
            continue
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if name in BOOL_FLAGS:
                value = "true"
            elif i < len(argv):
                value, i = argv[i], i + 1
        out[name] = value
    return out


def _flag_limits(limits: PullLimits, flags: dict[str, str]) -> PullLimits:
    if "serialize-image-pulls" in flags:
        v = flags["serialize-image-pulls"].lower()
        if v not in ("true", "false", "1", "0", "t", "f"):
            raise ValueError(f"--serialize-image-pulls={v!r} is not a boolean")
        limits = replace(limits, serialize_image_pulls=v in ("true", "1", "t"))
    if "max-parallel-image-pulls" in flags:
        n = int(flags["max-parallel-image-pulls"])
        limits = replace(limits, max_parallel_image_pulls=n if n > 0 else None)
    return limits


class KubeletConfigReader:
    """Reads kubelet's limits again only when what it read (the command line, the
    files' mtimes and sizes) changed."""

    def __init__(self, path: str = DEFAULT_PATH, proc: str = PROC) -> None:
        self.path = path
        self.proc = proc
        self._stamp: tuple[Any, ...] | None = None
        self._limits = unknown(path, "not read yet")

    def find_kubelet(self) -> KubeletProcess | None:
        """The node's kubelet: the one whose --config is our configured file, else the
        only one there is if it runs on flags alone (never a guess among several:
        test clusters run several kubelets on one host)."""
        found: list[KubeletProcess] = []
        try:
            pids = [p for p in os.listdir(self.proc) if p.isdigit()]
        except OSError:
            return None
        for pid in pids:
            try:
                with open(f"{self.proc}/{pid}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            if argv and os.path.basename(argv[0]) == "kubelet":
                found.append(KubeletProcess(int(pid), parse_flags(argv)))
        host_path = _PROC_ROOT.sub("", self.path)
        mine = [k for k in found if k.flags.get("config") in (host_path, self.path)]
        if len(mine) == 1:
            return mine[0]
        return found[0] if len(found) == 1 and "config" not in found[0].flags else None

    def _files(self, kubelet: KubeletProcess | None) -> tuple[str | None, list[str], str]:
        """(config file, drop-in files, where they come from) as this agent opens them."""
        if kubelet is None:
            return self.path, [], self.path
        root = f"{self.proc}/{kubelet.pid}/root"
        config = kubelet.flags.get("config") or None
        config_dir = kubelet.flags.get("config-dir") or ""
        dropins: list[str] = []
        if config_dir:
            names = sorted(n for n in os.listdir(root + config_dir) if n.endswith(".conf"))
            dropins = [f"{root}{config_dir}/{n}" for n in names]
        source = f"kubelet pid {kubelet.pid}: --config={config or ''}" + (
            f" --config-dir={config_dir}" if config_dir else "")
        return (root + config if config else None), dropins, source

    def _read(self) -> PullLimits:
        source = self.path
        try:
            kubelet = self.find_kubelet()
            config, dropins, source = self._files(kubelet)
            paths = ([config] if config else []) + dropins
            stamps = tuple((p, os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths)
            stamp = (kubelet, stamps)
            if stamp == self._stamp:
                return self._limits
            limits = PullLimits(source=source)
            for p in paths:
                with open(p, encoding="utf-8") as f:
                    limits = _apply(limits, _load(f.read()))
            if kubelet is not None:
                limits = _flag_limits(limits, kubelet.flags)
            self._limits, self._stamp = limits, stamp
        except (OSError, ValueError, yaml.YAMLError) as err:
            self._stamp = None
            self._limits = unknown(source, f"{type(err).__name__}: {err}")
        return self._limits

    async def limits(self) -> PullLimits:
        return await asyncio.to_thread(self._read)
