#!/usr/bin/env bash
# Copy groups between attached tensors (shared and plain memory of user processes) against the
# same group between worker-owned tensors, in one run (bench/attach_bench.py). Builds -c opt;
# arguments go to attach_bench.py (--tensors N --shape R,C --reps K --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //coordinator:coordinator //worker:worker >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
bash tools/python.sh bench/attach_bench.py --coordinator "$bin/coordinator/coordinator" \
  --worker "$bin/worker/worker" "$@"
