#!/usr/bin/env bash
# The main job. Installs what is missing, builds shardctl and shows the sharding core on the
# examples that define shardcoord's layouts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build -c opt //client:shardctl
shardctl=bazel-bin/client/shardctl
run() { echo; echo "\$ shardctl $*"; "$shardctl" "$@"; }
run layout --mesh 2x4 --dims dp,tp --shape 8,4 --placements 'S(0),S(0)'
run layout --mesh 8 --shape 2 --placements 'S(0)' --json
run layout --mesh 2x2 --shape 10,6 --placements 'S(0,[3,7]),S(1)'
run layout --mesh 4 --shape 6,5 --flat '0:4,20:30;4:20;;'
bazel shutdown >/dev/null 2>&1 || true
