"""Shell completion for both plugins through kubectl's plugin-completion convention.

kubectl (1.26+) completes ``kubectl ncp <TAB>`` by running the executable
``kubectl_complete-ncp`` with the words typed after the plugin's name, the last
one being the word under the cursor (maybe empty). It prints cobra's
``__complete`` format: one candidate per line, then ``:<directive>``, a bit set
of cobra's ShellCompDirective (1 error, 2 no space after the candidate, 4 no
file completion as fallback).

Candidates come from the API, read with the flags typed so far (--kubeconfig,
--context, -n, ...): pod names, ``KIND/NAME`` of workloads for
image-pull-progress, container names after ``-c``, namespaces after ``-n``, and
``POD:`` for ncp (the remote path itself is not completed). A failing or slow
API gives no candidates rather than an error: a TAB must never hang or spew.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

from aggapi.plugins.common import add_connection_flags, connect

DIRECTIVE_DEFAULT, DIRECTIVE_NO_SPACE, DIRECTIVE_NO_FILE = 0, 2, 4
TIMEOUT = 5.0  # seconds for the whole completion, when --request-timeout is not given
WORKLOADS = {"deployment": "/apis/apps/v1", "statefulset": "/apis/apps/v1",
             "daemonset": "/apis/apps/v1", "job": "/apis/batch/v1"}
VALUE_FLAGS = ("-c", "--container", "-n", "--namespace")


def _flags_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_connection_flags(p)
    p.add_argument("-c", "--container", action="append", default=[])
    for flag in ("--granularity", "-o", "--limit-rate", "--retries"):  # swallow their values
        p.add_argument(flag)
    return p


async def _names(args: argparse.Namespace, path: str) -> list[str]:
    conn = await connect(args)
    try:
        async with conn.request("GET", path) as resp:
            raw = await resp.read()
    finally:
        await conn.close()
    doc = await asyncio.to_thread(json.loads, raw)  # untrusted: parsed off the loop
    items = doc.get("items") if isinstance(doc, dict) else None
    if isinstance(items, list):
        return sorted(str((i.get("metadata") or {}).get("name", "")) for i in items
                      if isinstance(i, dict))
    spec = doc.get("spec") if isinstance(doc, dict) else None  # one pod: its containers
    if isinstance(spec, dict):
        return [str(c.get("name")) for key in ("containers", "initContainers")
                for c in spec.get(key) or () if isinstance(c, dict)]
    return []


async def _context_namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return str(args.namespace)
    conn = await connect(args)
    await conn.close()
    return conn.namespace


async def candidates(plugin: str, words: Sequence[str]) -> tuple[list[str], int]:
    """(candidates, directive) for the last of ``words`` (the word being completed)."""
    *typed, current = list(words) or [""]
    prev = typed[-1] if typed else ""
    # A value flag last: its value is being typed (argparse would refuse it as missing).
    args, rest = _flags_parser().parse_known_args(typed[:-1] if prev in VALUE_FLAGS
                                                  else typed)
    positionals = [w for w in rest if not w.startswith("-")]
    if args.request_timeout == 0.0:
        args.request_timeout = TIMEOUT
    if current.startswith("-") and prev not in VALUE_FLAGS:
        return [], DIRECTIVE_NO_FILE  # flags: --help lists them
    ns = await _context_namespace(args)
    if prev in ("-n", "--namespace"):
        return _match(await _names(args, "/api/v1/namespaces"), current), DIRECTIVE_NO_FILE
    if prev in ("-c", "--container"):
        pod = _pod_of(plugin, positionals)
        if pod is None:
            return [], DIRECTIVE_NO_FILE
        pod_ns, name = pod
        names = await _names(args, f"/api/v1/namespaces/{pod_ns or ns}/pods/{name}")
        return _match(names, current), DIRECTIVE_NO_FILE
    if plugin == "ncp":
        return await _ncp(args, ns, positionals, current)
    return await _progress(args, ns, positionals, current)


def _pod_of(plugin: str, positionals: list[str]) -> tuple[str | None, str] | None:
    if plugin != "ncp":
        return (None, positionals[0]) if positionals and "/" not in positionals[0] else None
    for w in positionals:
        head, sep, _ = w.partition(":")
        if sep and head:
            ns, _, pod = head.rpartition("/")
            return ns or None, pod
    return None


def _match(names: list[str], prefix: str) -> list[str]:
    return [n for n in names if n.startswith(prefix)]


async def _ncp(args: argparse.Namespace, ns: str, positionals: list[str],
               current: str) -> tuple[list[str], int]:
    if len(positionals) >= 2 or ":" in current:
        return [], DIRECTIVE_NO_FILE  # both given, or a path inside the container
    if current.startswith((".", "/", "~")) or (current and "/" in current):
        return [], DIRECTIVE_DEFAULT  # a local path: the shell completes files
    pods = _match(await _names(args, f"/api/v1/namespaces/{ns}/pods"), current)
    # No match: fall back to local files (the other side of the copy).
    return [p + ":" for p in pods], DIRECTIVE_NO_SPACE if pods else DIRECTIVE_DEFAULT


async def _progress(args: argparse.Namespace, ns: str, positionals: list[str],
                    current: str) -> tuple[list[str], int]:
    if positionals:
        return [], DIRECTIVE_NO_FILE
    kind, slash, prefix = current.partition("/")
    if slash and kind in WORKLOADS:
        names = await _names(args, f"{WORKLOADS[kind]}/namespaces/{ns}/{kind}s")
        return [f"{kind}/{n}" for n in _match(names, prefix)], DIRECTIVE_NO_FILE
    pods = _match(await _names(args, f"/api/v1/namespaces/{ns}/pods"), current)
    kinds = [f"{k}/" for k in WORKLOADS if k.startswith(current)]
    # A KIND/ prefix must not get a space after it; then pods need no space either.
    return pods + kinds, DIRECTIVE_NO_FILE | (DIRECTIVE_NO_SPACE if kinds else 0)


def complete(plugin: str, argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        found, directive = asyncio.run(asyncio.wait_for(candidates(plugin, words),
                                                        TIMEOUT * 2))
    except Exception:  # no server, no rights, no kubeconfig: nothing to offer
        found, directive = [], DIRECTIVE_NO_FILE
    for c in found:
        print(c)
    print(f":{directive}")
    return 0


def _forget_launcher() -> None:
    # The release's kubectl_complete-* select this entry point of the plugin's zipapp
    # with SHIV_ENTRY_POINT: not for the processes we start (exec credential plugins).
    os.environ.pop("SHIV_ENTRY_POINT", None)


def ncp_main() -> int:
    """``kubectl_complete-ncp``."""
    _forget_launcher()
    return complete("ncp")


def image_pull_progress_main() -> int:
    """``kubectl_complete-image_pull_progress``."""
    _forget_launcher()
    return complete("image_pull_progress")
