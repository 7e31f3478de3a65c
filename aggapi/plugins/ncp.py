"""kubectl ncp [-c CONTAINER] SRC DST — native copy through pods/copy (KEP-4582).

Installed as ``kubectl-ncp``. Same syntax as ``kubectl cp``: one side is
``[namespace/]pod:path``, the other a local path; a relative container path is
relative to the container's working directory. No ``tar`` in the image, sha256
verified, downloads resumable (run it again after an interruption), atomic at
both ends, and a non-zero exit on any failure (exit 3 when a directory copy had
to skip entries such as device files, or refused entries that would lead outside
the destination, one warning each). Like ``cp -r``: when DST is an existing
directory, SRC is copied into it.

Only argparse and :mod:`aggapi.plugins.common` are imported up front, so
``--help`` stays fast; the client (aiohttp) and rich come in :func:`run`.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import stat
import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from aggapi.plugins.common import (
    EXIT_OK,
    EXIT_PARTIAL,
    UsageError,
    connect,
    new_parser,
    run_plugin,
)

if TYPE_CHECKING:
    from aggapi.client.connection import Connection
    from aggapi.client.copy import RemotePath, Result

EXIT_SKIPPED = EXIT_PARTIAL
DNS = r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?"
REMOTE = re.compile(rf"^(?:(?P<ns>{DNS})/)?(?P<pod>{DNS}):(?P<path>.*)$")
DEFAULT_RETRIES = 8
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"


def parse_remote(spec: str) -> tuple[str | None, str, str] | None:
    """(namespace, pod, path) of ``[ns/]pod:path``; None for a local path. An empty
    path is the container's working directory, as ``kubectl cp`` takes it."""
    m = REMOTE.match(spec)
    if m is None:
        return None
    path = m.group("path") or "."
    if "\0" in path:
        raise UsageError(f"{spec}: the container path contains a NUL byte")
    return m.group("ns"), m.group("pod"), path


def rate(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)", text.strip().upper())
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid rate {text!r}")
    return float(m.group(1)) * 1024 ** " KMG".index(m.group(2) or " ")


EXAMPLES = """examples:
  kubectl ncp web:/etc/app.conf ./app.conf          # download a file
  kubectl ncp web:logs ./logs                       # relative: the container's working dir
  kubectl ncp -c app ./site prod/web:/srv/site      # upload a directory
  kubectl ncp --retries=-1 web:/data/big.img .      # resume until it is complete

Like kubectl cp: -c picks the container; without it the pod's
kubectl.kubernetes.io/default-container annotation does, else its first container
(with a "Defaulted container" notice when the pod has several). A relative
container path resolves against the container's working directory. --retries N
retries a failed transfer N times in a row without progress, resuming a download
where it stopped (0: never, negative: forever). --no-preserve does not carry the
local permissions into the container, for a file or a directory's entries (nor
the container file's onto a downloaded file): new entries get the defaults (0644,
directories 0755); owners are never copied. Symlinks are not followed: a download
of a path that is a symlink is refused unless -P (then it is made as a link, and only
if it points inside the destination's directory), and an upload of a local symlink is
refused unless -L (which uploads what it points to); links inside a directory are
copied as links."""


def parser() -> argparse.ArgumentParser:
    p = new_parser(
        "kubectl ncp",
        "Copy files and directories to and from containers without tar in the image; "
        "verified, resumable and atomic.", examples=EXAMPLES,
        exit_codes="  3    a directory copy skipped or refused entries (one warning each)\n")
    p.add_argument("src", help="local path or [namespace/]pod:path")
    p.add_argument("dst", help="local path or [namespace/]pod:path")
    p.add_argument("-c", "--container",
                   help="container (default: the default-container annotation, else the "
                        "first)")
    p.add_argument("--retries", type=int, default=DEFAULT_RETRIES, metavar="N",
                   help=f"retries of a failed transfer, resuming (default {DEFAULT_RETRIES}; "
                        "0: none; negative: forever)")
    p.add_argument("--no-preserve", action="store_true",
                   help="do not keep permissions (and ownership) of the copied file")
    p.add_argument("--no-overwrite", action="store_true",
                   help="fail instead of replacing an existing file in the container")
    p.add_argument("-P", "--no-dereference", action="store_true",
                   help="download: copy a symlink as a symlink (pointing inside the "
                        "destination's directory); without it a symlink is refused")
    p.add_argument("-L", "--dereference", action="store_true",
                   help="upload: follow a local symlink given as the source; without it a "
                        "symlink is refused")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--limit-rate", type=rate, metavar="RATE",
                   help="at most RATE bytes/s; suffixes K, M, G (powers of 1024)")
    return p


def _local_target(dst: Path, remote_path: str) -> Path:
    from aggapi.client.errors import LocalError

    if dst.is_dir():
        name = PurePosixPath(remote_path).name
        if not name or name == "..":
            raise LocalError.from_message(f"cannot copy the container's {remote_path} into a "
                                          "directory; name a new destination")
        return dst / name
    if not dst.parent.is_dir():
        raise LocalError.from_message(f"{dst.parent}: no such directory")
    return dst


def _local_source(src: Path, follow_links: bool) -> os.stat_result:
    from aggapi.client.errors import LocalError

    try:
        # A symlink is followed only with -L: one a download left (app.conf ->
        # .ssh/id_ed25519) must not upload the file it points to.
        st = os.stat(src) if follow_links else os.lstat(src)
    except OSError as exc:
        raise LocalError.from_message(f"{src}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise LocalError.from_message(
            f"{src} is a symbolic link; not followed (-L uploads what it points to)")
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise LocalError.from_message(f"{src}: not a regular file or directory")
    return st


def _pod_missing(exc: Any) -> bool:
    det = exc.status.get("details") or {}
    return det.get("kind") == "pods" or exc.message.startswith('pods "')


async def _remote_target(conn: Connection, rp: RemotePath, src: Path) -> RemotePath:
    from aggapi.client.copy import RemotePath, stat_remote
    from aggapi.client.errors import NotFound

    try:
        st = await stat_remote(conn, rp)
    except NotFound as exc:
        if _pod_missing(exc):
            raise
        return rp  # a new name in an existing directory
    if st.get("type") == "dir":
        return RemotePath(rp.namespace, rp.pod, str(PurePosixPath(rp.path) / src.name),
                          rp.container)
    return rp


def pick_container(pod: dict[str, Any]) -> tuple[str | None, str | None]:
    """kubectl's choice without -c: (container, notice). The default-container
    annotation, else the first container; a notice when there was a choice."""
    spec = pod.get("spec") or {}
    names = [str(c.get("name")) for c in spec.get("containers") or () if isinstance(c, dict)]
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        DEFAULT_CONTAINER_ANNOTATION)
    chosen = ann if isinstance(ann, str) and ann else (names[0] if names else None)
    if chosen is None or (len(names) < 2 and chosen in names):
        return chosen, None
    return chosen, f'Defaulted container "{chosen}" out of: {", ".join(names)}'


async def default_container(conn: Connection, namespace: str, pod: str) -> str | None:
    """The container kubectl would pick, or None to leave it to the server (the pod
    cannot be read here, e.g. RBAC allows pods/copy but not get pods)."""
    import asyncio
    import json

    from aggapi.client.errors import AggapiError

    try:
        async with conn.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}") as resp:
            raw = await resp.read()
        doc = await asyncio.to_thread(json.loads, raw)
    except (AggapiError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    chosen, notice = pick_container(doc)
    if notice:
        print(notice, file=sys.stderr)
    return chosen


async def run(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib

    from aggapi.client.copy import (
        NoProgress,
        PackedDir,
        Progress,
        RemotePath,
        download,
        pack_dir,
        upload_dir,
        upload_file,
    )
    from aggapi.client.retry import Backoff

    # What is loaded now (the modules, ~100k objects) lives until exit: out of the
    # collector's sight, a collection during the copy does not walk it, nor does the one
    # at exit (35 ms of a small copy's CPU otherwise).
    gc.freeze()
    src_r, dst_r = parse_remote(args.src), parse_remote(args.dst)
    if (src_r is None) == (dst_r is None):
        raise UsageError("exactly one of SRC and DST must be [namespace/]pod:path")
    packing: asyncio.Task[PackedDir] | None = None
    if src_r is None:
        st = _local_source(Path(args.src), args.dereference)
        if stat.S_ISDIR(st.st_mode):
            # A tree's listing and tar size need no server: they are made while the
            # connection is made and the pod and target are looked up (the tar itself
            # is built as it is sent).
            packing = asyncio.create_task(pack_dir(Path(args.src),
                                                   preserve=not args.no_preserve,
                                                   follow_links=args.dereference))
    try:
        conn = await connect(args)
    except BaseException:
        if packing is not None:
            packing.cancel()
            with contextlib.suppress(BaseException):
                await packing
        raise
    bar: Any = None
    ok = False
    try:
        remote = src_r or dst_r
        assert remote is not None
        ns = remote[0] or conn.namespace
        container = args.container or await default_container(conn, ns, remote[1])
        rp = RemotePath(ns, remote[1], remote[2], container)
        progress: Progress = NoProgress()
        if not args.quiet and sys.stderr.isatty():
            from aggapi.plugins.transferbar import TransferBar

            bar = TransferBar(f"{args.src} → {args.dst}")
            progress = bar
        # kubectl cp's --retries: negative is forever.
        backoff = Backoff(attempts=args.retries if args.retries >= 0 else sys.maxsize)
        if src_r is not None:
            dest = _local_target(Path(args.dst), rp.path)
            res = await download(conn, rp, dest, progress=progress, backoff=backoff,
                                 rate_limit=args.limit_rate, preserve=not args.no_preserve,
                                 keep_symlink=args.no_dereference)
        else:
            src = Path(args.src)
            rp = await _remote_target(conn, rp, src)
            if packing is not None:
                res = await upload_dir(conn, src, rp, progress=progress, backoff=backoff,
                                       rate_limit=args.limit_rate,
                                       preserve=not args.no_preserve,
                                       follow_links=args.dereference, packed=await packing)
            else:
                res = await upload_file(conn, src, rp, overwrite=not args.no_overwrite,
                                        mode=None if args.no_preserve else st.st_mode & 0o777,
                                        progress=progress, backoff=backoff,
                                        rate_limit=args.limit_rate,
                                        follow_links=args.dereference)
        ok = True
    finally:
        if packing is not None:  # (done: its result or error is read, and dropped)
            packing.cancel()
            with contextlib.suppress(BaseException):
                await packing
        if bar is not None:
            bar.close(ok)
        await conn.close()
    return summarize(args, res)


def summarize(args: argparse.Namespace, res: Result) -> int:
    if not args.quiet:
        # Only here: render imports rich, 50 ms of a -q copy's start-up otherwise.
        from aggapi.plugins.render import human_bytes

        what = {"file": f"{human_bytes(res.size)}, sha256 {res.sha256[:16]}…",
                "dir": f"{res.entries} entries, {human_bytes(res.size)}",
                "symlink": "symlink"}.get(res.kind, res.kind)
        extra = f", resumed at {res.resumed_from} bytes" if res.resumed_from else ""
        extra += f", {res.retries} reconnects" if res.retries else ""
        print(f"copied {args.src} -> {res.path} ({what}{extra})", file=sys.stderr)
    if not res.verified:
        print("warning: the agent sent no sha256 per file (an aggapi agent older than this "
              "plugin); the files were not checked one by one", file=sys.stderr)
    for s in res.skipped:
        print(f"warning: skipped {s}", file=sys.stderr)
    for r in res.refused:
        print(f"warning: refused {r}", file=sys.stderr)
    if res.skipped:
        print(f"error: {len(res.skipped)} entries were not copied", file=sys.stderr)
    if res.refused:
        print(f"error: {len(res.refused)} entries were refused", file=sys.stderr)
    return EXIT_SKIPPED if res.skipped or res.refused else EXIT_OK


def _partial_hint(args: argparse.Namespace) -> None:
    from aggapi.client.errors import AggapiError

    try:
        remote = parse_remote(args.src)
        if remote is None:
            return
        base = _local_target(Path(args.dst), remote[2])
    except (AggapiError, OSError, UsageError):
        return
    partial = base.with_name(f".{base.name}.ncp-partial")
    if partial.exists():
        print(f"partial download kept in {partial}; run the same command again to resume",
              file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    return run_plugin(parser(), argv, run, on_failure=_partial_hint)


if __name__ == "__main__":
    sys.exit(main())
