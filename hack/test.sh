#!/usr/bin/env bash
# README's test command: lint, type-check, then unit + integration (+ e2e) tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/install-deps.sh
# kubectl from the pinned module (cached after the first build): the plugin tests name it
# when they are collected, before any test builds the rest on demand.
bash hack/build-binaries.sh kubectl
python3 -m ruff check aggapi tests benchmarks
python3 -m mypy aggapi tests benchmarks
# The slowest tests, printed: what to look at when the run nears its 25-minute budget.
python3 -m pytest -q -ra --durations=30 "$@"
