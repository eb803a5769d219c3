#!/usr/bin/env bash
# Runs every check: installs what is missing, then
#   1. tools/format.sh --check            (the tree is clang-format-14 clean)
#   2. bazel build --config=threadsafety //...   (clang 14, -Werror=thread-safety-analysis)
#   3. tools/fuzz.sh                      (every fuzz target under libFuzzer + ASan/UBSan,
#                                          bounded runs, fixed seed; about 1.5 min)
#   3b. deploy/check.sh                   (every Kubernetes overlay renders and validates)
#   3c. deploy/image/build.sh             (the image's root filesystem, for multihost_test)
#   4. bazel test //...
# and ends with one line "N passed, M failed": the three checks plus every test target Bazel
# ran.
# Exit status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
checks_passed=0
checks_failed=0
check() {  # check NAME COMMAND...: runs a check, prints its verdict, counts it.
  local name=$1
  shift
  echo "=== ${name}: $*"
  if "$@"; then
    echo "=== ${name}: PASSED"
    checks_passed=$((checks_passed + 1))
  else
    echo "=== ${name}: FAILED"
    checks_failed=$((checks_failed + 1))
  fi
}

check format bash tools/format.sh --check
check threadsafety bazel build --config=threadsafety //...
check fuzz bash tools/fuzz.sh
check deploy bash deploy/check.sh
# The image's root filesystem (Debian part cached in ~/.cache/shardcoord-image): the
# multi-host test runs its workers from it (acceptance of issue 14).
rootfs=$PWD/deploy/image/out/rootfs
check image bash deploy/image/build.sh --no-import --compilation-mode fastbuild --rootfs "$rootfs"
rootfs_env=()
if [[ -x $rootfs/usr/local/bin/shardcoord-worker ]]; then
  rootfs_env=(--test_env=SHARDCOORD_TEST_ROOTFS="$rootfs")
fi

bazel test //... "${rootfs_env[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
bazel shutdown >/dev/null 2>&1 || true

# Bazel prints one summary line per test target: "//pkg:name  PASSED in 1.2s" (or FAILED,
# TIMEOUT, FLAKY, NO STATUS, FAILED TO BUILD, ...). Count them ourselves.
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|FAILED TO BUILD)' "$log")
if ((rc != 0 && failed == 0)); then failed=1; fi  # A build error before any test ran.
echo "$((passed + checks_passed)) passed, $((failed + checks_failed)) failed"
if ((rc != 0 || checks_failed != 0)); then exit 1; fi
exit 0
