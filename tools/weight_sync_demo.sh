#!/usr/bin/env bash
# RL weight sync with attached tensors (also `tools/main.sh --demo weight-sync`): builds the
# daemons (-c opt), starts a coordinator and six CPU workers on loopback, four torch trainer
# processes (FSDP-flat shards of a small transformer) and two inference processes (Megatron
# tensor-parallel shards), all lending their shards to the workers beside them; ten times the
# trainers step in place, one copy_many updates the inference shards in place, and the inference
# processes check them against the full state dict they compute themselves. Prints the time
# and bytes of each sync; ends with "weight-sync: OK". Arguments go to tools/weight_sync_demo.py
# (--steps N, --width W, --layers L).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build -c opt //coordinator:coordinator //worker:worker
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
logs=$(mktemp -d -t shardcoord-weight-sync.XXXXXX)
trap 'rm -rf "$logs"' EXIT
if ! bash tools/python.sh "tools/weight_sync_demo.py" --coordinator "$bin/coordinator/coordinator" \
  --worker "$bin/worker/worker" --log-dir "$logs" "$@"; then
  echo "weight-sync: FAILED; daemon logs:" >&2
  for f in "$logs"/*.log; do
    echo "--- $(basename "$f") (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
fi
