#!/usr/bin/env bash
# README's test command: lint, type-check, then unit + integration (+ e2e) tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/install-deps.sh
python3 -m ruff check aggapi tests benchmarks
python3 -m mypy aggapi tests benchmarks
python3 -m pytest -q -ra "$@"
