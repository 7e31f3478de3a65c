"""kubectl image-pull-progress (POD | TYPE/NAME | -l SELECTOR | --node NODE | -A)

Installed as ``kubectl-image_pull_progress``. For one pod it follows the pod's
image pulls until every image is present (exit 0) or a pull fails (exit 1, with
the error); on a terminal it draws rich bars, otherwise plain lines, and with
``-o json`` it passes the NDJSON objects through unchanged. For a workload, a
selector, a node or -A it follows every selected pod (and pods that appear), with no
cap, through one list and watch of the ``podimagepulls`` collection: one screen,
stuck pods first (aggapi.plugins.pullset), or with ``-o json`` the watch's events.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

# Only argparse and common up front: --help must not import aiohttp or rich.
from aggapi.plugins.common import EXIT_FAIL, EXIT_OK, UsageError, connect, new_parser, run_plugin
from aggapi.plugins.pacing import STALL_SECONDS

if TYPE_CHECKING:
    from aggapi.client.connection import Connection
    from aggapi.plugins.collection import Change
    from aggapi.plugins.render import PullView
    from aggapi.plugins.targets import Target

EXAMPLES = f"""targets:
  POD | pod/NAME        one pod (-c, --granularity and --no-follow apply)
  deployment/NAME       the workload's pods, now and as they appear (also statefulset/,
                        daemonset/, replicaset/, job/); like kubectl rollout status
  -l SELECTOR           pods matching a label selector
  --node NODE           pods scheduled to NODE
  -A                    with -l or --node: in every namespace; alone: every pod

For many pods, every selected pod is followed (one list and watch of the
podimagepulls collection, whatever their number). A header counts the pods done,
pulling, waiting for a pull slot and stuck, and names the slowest nodes; then one
row per pod, as many as the terminal holds (--max-rows), stuck first (Failed,
BackOff, Stalled = no new bytes for {STALL_SECONDS:.0f} s), then waiting for a slot, then
pulling, longest ETA first, then done. -o json prints the watch's events, one per
line. Exit status 1 also means that a followed pull failed (with --fail-fast: at the
first failure)."""


def parser() -> argparse.ArgumentParser:
    p = new_parser(
        "kubectl image-pull-progress",
        "Show the image pull progress of pods (KEP-5334).", examples=EXAMPLES)
    p.add_argument("target", nargs="?", metavar="POD|TYPE/NAME",
                   help="a pod, or deployment/NAME, statefulset/, daemonset/, replicaset/, job/")
    p.add_argument("-l", "--selector", help="label selector of the pods to follow")
    p.add_argument("-A", "--all-namespaces", action="store_true",
                   help="select pods in every namespace")
    p.add_argument("--node", help="follow the pods scheduled to this node")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop at the first failed pull (exit 1)")
    p.add_argument("-c", "--container", action="append", default=[],
                   help="only this container's image (repeatable)")
    p.add_argument("--granularity", choices=("layer", "image", "pod"), default="layer")
    p.add_argument("-o", "--output", choices=("json",),
                   help="print the objects as NDJSON (many pods: the watch's events)")
    p.add_argument("--max-rows", type=int, metavar="N",
                   help="many pods: show at most N rows (default: what fits the terminal)")
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


def print_change(change: Change) -> None:
    """-o json: each watch event as received (a list's items as ADDED), one per line;
    json.dumps escapes every control character, so server text cannot drive the
    terminal."""
    events = ([{"type": "ADDED", "object": o} for o in change.items]
              if change.type == "LIST" else [{"type": change.type, "object": change.obj}])
    sys.stdout.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    sys.stdout.flush()


async def run_set(args: argparse.Namespace, conn: Connection, target: Target) -> int:
    from aggapi.plugins.pullset import Runner
    from aggapi.plugins.setview import PlainSetView, RichSetView
    from aggapi.plugins.targets import resolve

    def retrying(exc: BaseException, delay: float) -> None:
        from aggapi.plugins.sanitize import clean

        print(clean(f"watch interrupted ({exc or type(exc).__name__}); "
                    f"reconnecting in {delay:.1f}s"), file=sys.stderr, flush=True)

    try:
        ns = args.namespace or conn.namespace
        target = await resolve(conn, target, ns)
        json_out = args.output == "json"
        runner = Runner(conn, target, ns, fail_fast=args.fail_fast, redraw=lambda: None,
                        on_change=print_change if json_out else None, on_retry=retrying)
        view: RichSetView | PlainSetView | None = None
        if not json_out:
            view = RichSetView(runner.set, args.max_rows) if sys.stdout.isatty() \
                else PlainSetView(runner.set)
            runner.redraw = view.redraw
        try:
            failures = await runner.run()
        finally:
            if view is not None:
                view.close()
    finally:
        await conn.close()
    from aggapi.plugins.sanitize import clean

    for f in failures:
        print(f"error: {clean(f)}", file=sys.stderr)
    return EXIT_FAIL if failures else EXIT_OK


async def run(args: argparse.Namespace) -> int:
    from aggapi.client.errors import ClientError
    from aggapi.client.progress import PRESENT_PHASES, all_present, watch_progress
    from aggapi.plugins.sanitize import clean
    from aggapi.plugins.targets import parse_target

    try:
        target = parse_target(args.target, selector=args.selector, node=args.node,
                              all_namespaces=args.all_namespaces)
    except ClientError as exc:
        raise UsageError(str(exc)) from exc
    single_only = [f for f, on in (("-c", args.container),
                                   ("--no-follow", args.no_follow)) if on]
    if not target.single and single_only:
        raise UsageError(f"{', '.join(single_only)}: only with a single pod")
    if target.single and args.max_rows is not None:
        raise UsageError("--max-rows: only with many pods")
    if args.max_rows is not None and args.max_rows < 1:
        raise UsageError("--max-rows must be at least 1")
    conn = await connect(args)
    if not target.single:
        return await run_set(args, conn, target)
    args.pod = target.pod
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
        print(clean(f"error: images not present yet: "
                    f"{', '.join(pending) or 'no progress reported'}"),
              file=sys.stderr)  # servers before 'every stream ends with a final object'
        return EXIT_FAIL
    if final.get("kind") == "Summary" and all_present(final):
        return EXIT_OK
    if final.get("kind") == "Summary":  # a --no-follow snapshot: what is not there yet
        pending = [f"{i.get('container')} ({i.get('phase')})" for i in final.get("images") or []
                   if i.get("phase") not in PRESENT_PHASES]
        print(clean(f"error: images not present yet: "
                    f"{', '.join(pending) or final.get('phase')}"), file=sys.stderr)
        return EXIT_FAIL
    msg = final.get("error") or f"pull ended in phase {final.get('phase')}"
    where = " ".join(str(x) for x in (final.get("container"), final.get("image")) if x)
    print(clean(f"error: {where + ': ' if where else ''}{msg}"), file=sys.stderr)
    return EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    return run_plugin(parser(), argv, run)


if __name__ == "__main__":
    sys.exit(main())
