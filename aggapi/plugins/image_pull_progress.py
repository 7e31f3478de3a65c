"""kubectl image-pull-progress POD [-c CONTAINER]... [--granularity layer|image|pod] [-o json]

Installed as ``kubectl-image_pull_progress``. Follows the pod's image pulls
until every image is present (exit 0) or a pull fails (exit 1, with the error).
On a terminal it draws rich bars; otherwise it prints plain lines, and with
``-o json`` it passes the NDJSON objects through unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

# Only argparse and common up front: --help must not import aiohttp or rich.
from aggapi.plugins.common import EXIT_FAIL, EXIT_OK, connect, new_parser, run_plugin

if TYPE_CHECKING:
    from aggapi.plugins.render import PullView


def parser() -> argparse.ArgumentParser:
    p = new_parser(
        "kubectl image-pull-progress",
        "Show the image pull progress of a pod (KEP-5334).")
    p.add_argument("pod")
    p.add_argument("-c", "--container", action="append", default=[],
                   help="only this container's image (repeatable)")
    p.add_argument("--granularity", choices=("layer", "image", "pod"), default="layer")
    p.add_argument("-o", "--output", choices=("json",), help="print the objects as NDJSON")
    p.add_argument("--no-follow", action="store_true",
                   help="print the current state once instead of following the pulls")
    return p


class JsonView:
    """The PullView interface, printing NDJSON (no rich needed)."""

    def close(self) -> None:
        pass

    def update(self, o: dict[str, Any]) -> None:
        print(json.dumps(o, separators=(",", ":")), flush=True)

    def retrying(self, exc: BaseException, delay: float) -> None:
        print(f"stream interrupted ({exc}); reconnecting in {delay:.1f}s", file=sys.stderr)


def choose_view(args: argparse.Namespace) -> PullView | JsonView:
    from aggapi.plugins.render import PlainPullView, RichPullView

    if args.output == "json":
        return JsonView()
    if sys.stdout.isatty():
        return RichPullView(args.granularity)
    return PlainPullView(args.granularity)


async def run(args: argparse.Namespace) -> int:
    from aggapi.client.progress import PRESENT_PHASES, all_present, watch_progress

    conn = await connect(args)
    view: PullView | JsonView | None = None
    final: dict[str, Any] | None = None
    rows: dict[tuple[str, str, str], str] = {}
    try:
        view = choose_view(args)
        async for obj in watch_progress(conn, args.pod, namespace=conn.namespace,
                                        containers=args.container,
                                        granularity=args.granularity,
                                        follow=not args.no_follow, on_retry=view.retrying):
            view.update(obj)
            if obj.get("kind") == "Progress":
                rows[(obj.get("container", ""), obj.get("image", ""), obj.get("layer", ""))] = \
                    str(obj.get("phase"))
            elif obj.get("kind") in ("Summary", "Error"):
                final = obj
    finally:
        if view is not None:
            view.close()
        await conn.close()
    if final is None:  # --no-follow: judge the snapshot
        pending = sorted({k[1] or "pod" for k, ph in rows.items() if ph not in PRESENT_PHASES})
        if rows and not pending:
            return EXIT_OK
        print(f"error: images not present yet: {', '.join(pending) or 'no progress reported'}",
              file=sys.stderr)
        return EXIT_FAIL
    if final.get("kind") == "Summary" and all_present(final):
        return EXIT_OK
    msg = final.get("error") or f"pull ended in phase {final.get('phase')}"
    where = " ".join(str(x) for x in (final.get("container"), final.get("image")) if x)
    print(f"error: {where + ': ' if where else ''}{msg}", file=sys.stderr)
    return EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    return run_plugin(parser(), argv, run)


if __name__ == "__main__":
    sys.exit(main())
