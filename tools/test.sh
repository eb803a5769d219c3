#!/usr/bin/env bash
# Runs every test: installs what is missing, then `bazel test //...`, and ends with one line
# "N passed, M failed" counting the test targets Bazel ran. Exit status is Bazel's.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
bazel shutdown >/dev/null 2>&1 || true

# Bazel prints one summary line per test target: "//pkg:name  PASSED in 1.2s" (or FAILED,
# TIMEOUT, FLAKY, NO STATUS, FAILED TO BUILD, ...). Count them ourselves.
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|FAILED TO BUILD)' "$log")
if ((rc != 0 && failed == 0)); then failed=1; fi  # A build error before any test ran.
echo "${passed} passed, ${failed} failed"
exit "$rc"
