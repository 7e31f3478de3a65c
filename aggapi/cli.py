"""The `aggapi` console script: one subcommand per process kind.

Each subcommand lives in its own module exposing ``main(argv) -> int``; they are
imported lazily so `aggapi certs` does not pay for grpc or kubernetes imports.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "apiserver": ("aggapi.apiserver.main", "serve the aggregated API (Deployment)"),
    "agent": ("aggapi.agent.main", "serve the node agent (DaemonSet)"),
    "certs": ("aggapi.tls.certs", "generate CA, serving/agent certificates and signing keys"),
}


def _usage() -> str:
    lines = ["usage: aggapi <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {doc}" for name, (_, doc) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("--version", "version"):
        from aggapi import __version__

        print(__version__)
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"aggapi: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(entry[0])
    except ModuleNotFoundError as exc:
        # The servers' libraries are an extra: say which, not a bare traceback.
        print(f"aggapi: {args[0]} needs {exc.name!r}: pip install 'aggapi[server]'",
              file=sys.stderr)
        return 1
    rc: int = module.main(args[1:])
    return rc
