"""What both kubectl plugins share: connection flags, error reporting, exit codes."""

from __future__ import annotations

import argparse
import sys

from aggapi.client.errors import AggapiError, ClientError

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    # kubectl does not hand its global flags to plugins: accept the usual ones here.
    p.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG "
                   "or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's)")


def report(err: BaseException) -> None:
    """Print an error the way kubectl does."""
    if isinstance(err, AggapiError) and not isinstance(err, ClientError):
        print(f"Error from server ({err.reason}): {err.message}", file=sys.stderr)
    else:
        print(f"error: {err}", file=sys.stderr)
