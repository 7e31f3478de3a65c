"""What both kubectl plugins share: kubectl's flags, error reporting, exit codes.

kubectl does not hand its global flags to plugins, so each plugin accepts the
ones that matter here itself (:func:`add_connection_flags`) and turns them into
a connection with :func:`connect`. :func:`run_plugin` is a plugin's whole
``main``: parse, set up -v logging, run, and map failures to kubectl-style
``error: ...`` lines and the documented exit codes.

Nothing heavy is imported at module level: ``--help`` must not pay for aiohttp,
yaml or rich (the client is imported inside :func:`connect` and :func:`report`).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from aggapi.client.connection import Connection, ConnectionFlags

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_PARTIAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EXIT_CODES = """exit status:
  0    success
  1    error (the message says which: from the server, the connection or locally)
  2    usage error (bad flags or arguments)
{extra}  130  interrupted (Ctrl-C)"""

CONNECTION_HELP = """connection flags are kubectl's: --kubeconfig (default $KUBECONFIG, then
~/.kube/config, then the pod's service account), --context, --cluster, --user,
-n/--namespace, -s/--server, --token, --certificate-authority,
--insecure-skip-tls-verify, --as, --as-group, --request-timeout, -v."""


class UsageError(ValueError):
    """A command line that cannot work (exit 2)."""


class KubectlParser(argparse.ArgumentParser):
    """argparse speaking kubectl's usage-error format."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}\nSee '{self.prog} --help' for usage.", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def new_parser(prog: str, description: str, *, examples: str = "",
               exit_codes: str = "") -> KubectlParser:
    """A plugin's parser with the connection flags and the documented exit codes."""
    epilog = "\n\n".join(x for x in (examples, CONNECTION_HELP,
                                      EXIT_CODES.format(extra=exit_codes)) if x)
    p = KubectlParser(prog=prog, description=description, epilog=epilog,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_flags(p)
    return p


def duration(text: str) -> float:
    """kubectl's --request-timeout: a Go duration (1m30s, 500ms) or plain seconds."""
    t = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        return float(t)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)", t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number of seconds or a unit (30s, 1m, 1h30m)")
    return sum(float(n) * units[u] for n, u in parts)


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection (kubectl's global flags)")
    g.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG "
                   "or ~/.kube/config)")
    g.add_argument("--context", help="the name of the kubeconfig context to use")
    g.add_argument("--cluster", help="the name of the kubeconfig cluster to use")
    g.add_argument("--user", help="the name of the kubeconfig user to use")
    g.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    g.add_argument("-s", "--server", help="the address and port of the Kubernetes API server")
    g.add_argument("--token", help="bearer token for authentication to the API server")
    g.add_argument("--certificate-authority", metavar="FILE",
                   help="path to a cert file for the certificate authority")
    g.add_argument("--insecure-skip-tls-verify", action="store_true",
                   help="do not check the server's certificate (insecure)")
    g.add_argument("--as", dest="as_user", metavar="USER",
                   help="username to impersonate for the operation")
    g.add_argument("--as-group", action="append", default=[], metavar="GROUP",
                   help="group to impersonate (repeatable)")
    g.add_argument("--request-timeout", type=duration, default=0.0, metavar="DURATION",
                   help="give up on a single request after this long (30s, 1m; "
                        "0: never, the default)")
    g.add_argument("-v", "--v", dest="verbosity", type=int, default=0, metavar="LEVEL",
                   help="log level: 6 logs each request, 7 also its headers")


def connection_flags(args: argparse.Namespace) -> ConnectionFlags:
    from aggapi.client.connection import ConnectionFlags

    return ConnectionFlags(
        kubeconfig=args.kubeconfig, context=args.context, cluster=args.cluster,
        user=args.user, namespace=args.namespace, server=args.server, token=args.token,
        certificate_authority=args.certificate_authority,
        insecure_skip_tls_verify=args.insecure_skip_tls_verify, impersonate=args.as_user,
        impersonate_groups=tuple(args.as_group), request_timeout=args.request_timeout or None)


async def connect(args: argparse.Namespace) -> Connection:
    """The connection the parsed flags describe (kubeconfig, overrides, in-cluster)."""
    from aggapi.client.connection import Connection

    return await Connection.load(flags=connection_flags(args))


class KlogFormatter(logging.Formatter):
    """klog's header (``I1123 19:20:00.123456   4242 file.py:12] msg``), as kubectl -v."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        us = int(record.msecs * 1000)
        head = (f"{record.levelname[0]}{time.strftime('%m%d %H:%M:%S', t)}.{us:06d} "
                f"{record.process:>7} {record.filename}:{record.lineno}]")
        return f"{head} {record.getMessage()}"


def setup_logging(verbosity: int) -> None:
    if verbosity <= 0:
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(KlogFormatter())
    root = logging.getLogger("aggapi")
    root.addHandler(h)
    root.setLevel(logging.DEBUG if verbosity >= 7 else logging.INFO if verbosity >= 6
                  else logging.WARNING)


def report(err: BaseException) -> None:
    """Print an error the way kubectl does."""
    from aggapi.client.errors import AggapiError, ClientError

    if isinstance(err, AggapiError) and not isinstance(err, ClientError):
        print(f"Error from server ({err.reason}): {err.message}", file=sys.stderr)
    elif isinstance(err, OSError) and err.filename and err.strerror:  # a local file
        print(f"error: {err.filename}: {err.strerror.lower()}", file=sys.stderr)
    else:
        print(f"error: {err}", file=sys.stderr)


def run_plugin(parser: argparse.ArgumentParser, argv: list[str] | None,
               run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]], *,
               on_failure: Callable[[argparse.Namespace], None] | None = None) -> int:
    """A plugin's main: parse, run, and turn every failure into ``error: ...`` + a code."""
    args = parser.parse_args(argv)
    setup_logging(args.verbosity)
    from aggapi import eventloop
    from aggapi.client.errors import AggapiError

    try:
        # uvloop: its TLS and socket reads cost about half of asyncio's per byte.
        return eventloop.run(run(args))
    except UsageError as exc:
        print(f"error: {exc}\nSee '{parser.prog} --help' for usage.", file=sys.stderr)
        return EXIT_USAGE
    except (AggapiError, OSError) as exc:
        report(exc)
        if on_failure is not None:
            on_failure(args)
        return EXIT_FAIL
    except KeyboardInterrupt:
        if on_failure is not None:
            on_failure(args)
        return EXIT_INTERRUPTED
