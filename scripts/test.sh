#!/usr/bin/env bash
# The test suite, on two pytest-xdist workers: the fast tests first, stopping at the first failure among them (a
# broken basic behaviour shows in a minute or two, not after the slow ones), then the tests marked slow (real
# servers, browsers, clusters, whole notebooks). Extra arguments go to both pytest runs. Ends with one line that
# counts both runs together.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
.venv/bin/python -m pytest -q -n 2 -m "not slow" -x "$@" 2>&1 | tee "$log"
fast=${PIPESTATUS[0]}
slow=0
if [ "$fast" = 0 ]; then
  .venv/bin/python -m pytest -q -n 2 -m slow "$@" 2>&1 | tee -a "$log"
  slow=${PIPESTATUS[0]}
  [ "$slow" = 5 ] && slow=0  # no test is marked slow: nothing to run is not a failure
fi
count() { grep -aoE "[0-9]+ $1" "$log" | awk '{n += $1} END {print n + 0}'; }
echo "all tests: $(count passed) passed, $(count failed) failed, $(count skipped) skipped"
[ "$fast" = 0 ] && [ "$slow" = 0 ]
