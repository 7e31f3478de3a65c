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
if (($#)); then
  exec python3 -m pytest -q -ra --durations=30 "$@"
fi
# The whole suite: two pytest runs side by side. The e2e tests (real clusters) spend most
# of their ~17 minutes waiting on time they measure (throttled pulls, rate windows, rolls)
# and the rest (~7 minutes) mostly on one core; one after the other they left a core idle.
# The unit run's output follows the e2e run's; the exit code is non-zero if either failed.
unit_log=$(mktemp /tmp/aggapi-unit-tests.XXXXXX)
python3 -m pytest -q -ra --durations=15 -m "not e2e" -p no:cacheprovider >"$unit_log" 2>&1 &
unit=$!
trap 'kill "$unit" 2>/dev/null || true; rm -f "$unit_log"' EXIT
e2e_rc=0
python3 -m pytest -q -ra --durations=30 -m e2e || e2e_rc=$?
unit_rc=0
wait "$unit" || unit_rc=$?
echo "=== unit and integration tests (run beside the e2e tests above): exit $unit_rc ==="
cat "$unit_log"
((e2e_rc == 0 && unit_rc == 0))
