"""kubectl ncp [-c CONTAINER] SRC DST — native copy through pods/copy (KEP-4582).

Installed as ``kubectl-ncp``. Same syntax as ``kubectl cp``: one side is
``[namespace/]pod:/absolute/path``, the other a local path. No ``tar`` in the
image, sha256 verified, downloads resumable (run it again after an
interruption), atomic at both ends, and a non-zero exit on any failure
(exit 3 when a directory copy had to skip entries such as device files, or
refused entries that would lead outside the destination, one warning each).
Like ``cp -r``: when DST is an existing directory, SRC is copied into it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import stat
import sys
from pathlib import Path, PurePosixPath

from aggapi.client.connection import Connection
from aggapi.client.copy import (
    NoProgress,
    Progress,
    RemotePath,
    Result,
    download,
    stat_remote,
    upload_dir,
    upload_file,
)
from aggapi.client.errors import AggapiError, LocalError, NotFound
from aggapi.plugins.common import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    add_connection_flags,
    report,
)
from aggapi.plugins.render import TransferBar, human_bytes

EXIT_SKIPPED = 3
DNS = r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?"
REMOTE = re.compile(rf"^(?:(?P<ns>{DNS})/)?(?P<pod>{DNS}):(?P<path>.*)$")


class UsageError(ValueError):
    pass


def parse_remote(spec: str) -> tuple[str | None, str, str] | None:
    """(namespace, pod, path) of ``[ns/]pod:/path``; None for a local path."""
    m = REMOTE.match(spec)
    if m is None:
        return None
    path = m.group("path")
    if not path.startswith("/"):
        raise UsageError(f"{spec}: the container path must be absolute")
    return m.group("ns"), m.group("pod"), path


def rate(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)", text.strip().upper())
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid rate {text!r}")
    return float(m.group(1)) * 1024 ** " KMG".index(m.group(2) or " ")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl ncp",
        description="Copy files and directories to and from containers without tar in the "
                    "image; verified, resumable and atomic.",
        epilog="examples: kubectl ncp web:/etc/app.conf ./app.conf ; "
               "kubectl ncp -c app ./site prod/web:/srv/site")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("-c", "--container", help="container (default: the pod's only one)")
    p.add_argument("--no-overwrite", action="store_true",
                   help="fail instead of replacing an existing file in the container")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--limit-rate", type=rate, metavar="RATE",
                   help="at most RATE bytes/s; suffixes K, M, G (powers of 1024)")
    add_connection_flags(p)
    return p


def _local_target(dst: Path, remote_path: str) -> Path:
    if dst.is_dir():
        name = PurePosixPath(remote_path).name
        if not name:
            raise LocalError.from_message("cannot copy the container's / into a directory; "
                                          "name a new destination")
        return dst / name
    if not dst.parent.is_dir():
        raise LocalError.from_message(f"{dst.parent}: no such directory")
    return dst


def _local_source(src: Path) -> os.stat_result:
    try:
        st = os.stat(src)  # a symlink given on the command line is followed, as cp does
    except OSError as exc:
        raise LocalError.from_message(f"{src}: {exc.strerror}") from exc
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise LocalError.from_message(f"{src}: not a regular file or directory")
    return st


def _pod_missing(exc: NotFound) -> bool:
    det = exc.status.get("details") or {}
    return det.get("kind") == "pods" or exc.message.startswith('pods "')


async def _remote_target(conn: Connection, rp: RemotePath, src: Path) -> RemotePath:
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


async def run(args: argparse.Namespace) -> int:
    src_r, dst_r = parse_remote(args.src), parse_remote(args.dst)
    if (src_r is None) == (dst_r is None):
        raise UsageError("exactly one of SRC and DST must be [namespace/]pod:/path")
    conn = await Connection.load(args.kubeconfig, args.context)
    bar: TransferBar | None = None
    ok = False
    try:
        ns_default = args.namespace or conn.namespace
        remote = src_r or dst_r
        assert remote is not None
        rp = RemotePath(remote[0] or ns_default, remote[1], remote[2], args.container)
        progress: Progress = NoProgress()
        if not args.quiet and sys.stderr.isatty():
            bar = TransferBar(f"{args.src} → {args.dst}")
            progress = bar
        if src_r is not None:
            dest = _local_target(Path(args.dst), rp.path)
            res = await download(conn, rp, dest, progress=progress,
                                 rate_limit=args.limit_rate)
        else:
            src = Path(args.src)
            st = _local_source(src)
            rp = await _remote_target(conn, rp, src)
            if stat.S_ISDIR(st.st_mode):
                res = await upload_dir(conn, src, rp, progress=progress,
                                       rate_limit=args.limit_rate)
            else:
                res = await upload_file(conn, src, rp, overwrite=not args.no_overwrite,
                                        mode=st.st_mode & 0o777, progress=progress,
                                        rate_limit=args.limit_rate)
        ok = True
    finally:
        if bar is not None:
            bar.close(ok)
        await conn.close()
    return summarize(args, res)


def summarize(args: argparse.Namespace, res: Result) -> int:
    if not args.quiet:
        what = {"file": f"{human_bytes(res.size)}, sha256 {res.sha256[:16]}…",
                "dir": f"{res.entries} entries, {human_bytes(res.size)}",
                "symlink": "symlink"}.get(res.kind, res.kind)
        extra = f", resumed at {res.resumed_from} bytes" if res.resumed_from else ""
        extra += f", {res.retries} reconnects" if res.retries else ""
        print(f"copied {args.src} -> {res.path} ({what}{extra})", file=sys.stderr)
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
    if parse_remote(args.src) is None:
        return
    dst = Path(args.dst)
    try:
        base = _local_target(dst, parse_remote(args.src)[2])  # type: ignore[index]
    except (AggapiError, OSError):
        return
    partial = base.with_name(f".{base.name}.ncp-partial")
    if partial.exists():
        print(f"partial download kept in {partial}; run the same command again to resume",
              file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return asyncio.run(run(args))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (AggapiError, OSError) as exc:
        report(exc)
        _partial_hint(args)
        return EXIT_FAIL
    except KeyboardInterrupt:
        _partial_hint(args)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
