#!/usr/bin/env bash
# The test suite in one pytest session on pytest-xdist workers (three on a two-core machine: much of a slow test is
# waiting on a server, a browser or a kernel to start, and a third worker fills that time): the fast tests first,
# then those marked slow (real servers, browsers, clusters, whole notebooks; tests/conftest.py orders them), stopping
# at the first failure, so a broken basic behaviour shows in the first minutes; `worksteal` hands the slow ones to
# whichever worker is free. One session instead of two saves a start-up and two idle tails. Extra arguments go to
# pytest. Ends with one line that counts the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
.venv/bin/python -m pytest -q -n "${MLMS_TEST_WORKERS:-3}" --dist worksteal -x "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
count() { grep -aoE "[0-9]+ $1" "$log" | tail -1 | awk '{n = $1} END {print n + 0}'; }
echo "all tests: $(count passed) passed, $(count failed) failed, $(count skipped) skipped"
exit "$rc"
