#!/usr/bin/env bash
# The main job: a local shardcoord cluster doing real work. Installs what is missing, builds,
# starts a coordinator and four CPU (Gloo) workers on loopback (free ports), then with
# shardctl: creates a 2x2 mesh and a 1024x1024 f32 tensor S(0),R filled with arange,
# redistributes it to R,S(1), to a 1-d mesh of the four workers with S(1), to an uneven and
# to a flat layout, gathers it to one rank, downloads it and checks every value. Prints each
# layout, then a report (time, bytes moved vs lower bound per step). Stops the daemons on
# every exit path. Exits non-zero if any step or check fails.
#
# tools/main.sh --secure runs the same job with TLS and bearer tokens: certificates from
# tools/dev_certs.sh, mutual TLS (--tls-client-auth=require: each worker's certificate must
# name it), a tokens file with an admin token for shardctl and a worker token for the workers.
#
# tools/main.sh --demo weight-sync runs the RL weight-sync demo instead
# (tools/weight_sync_demo.sh: torch trainers and inference processes with attached tensors).
set -euo pipefail
cd "$(dirname "$0")/.."
secure=0
case "${1:-}" in
  "") ;;
  --secure) secure=1 ;;
  --demo)
    case "${2:-}" in
      weight-sync) exec bash tools/weight_sync_demo.sh "${@:3}" ;;
      *)
        echo "usage: $0 --demo weight-sync [ARGS]" >&2
        exit 2
        ;;
    esac
    ;;
  *)
    echo "usage: $0 [--secure | --demo weight-sync]" >&2
    exit 2
    ;;
esac
bash tools/setup.sh

bazel build -c opt //coordinator:coordinator //worker:worker //client:shardctl //tools:check_npy
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
coordinator_bin=$bin/coordinator/coordinator
worker_bin=$bin/worker/worker
shardctl_bin=$bin/client/shardctl
check_npy_bin=$bin/tools/check_npy

work=$(mktemp -d -t shardcoord-main.XXXXXX)
pids=()
stop_daemons() {
  # Workers first, then the coordinator; SIGKILL whatever outlives a 5 s grace.
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
cleanup() {
  local rc=$?
  stop_daemons
  if ((rc != 0)); then
    echo "main: FAILED (exit $rc); daemon logs:" >&2
    for f in "$work"/*.log; do
      [[ -e $f ]] || continue
      echo "--- $(basename "$f") (last 20 lines)" >&2
      tail -n 20 "$f" >&2
    done
  fi
  rm -rf "$work"
  bazel shutdown >/dev/null 2>&1 || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts a daemon with stdout on a FIFO, reads lines until one contains $2 (30 s deadline),
# then drains the rest into <name>.out so the daemon never blocks on a full pipe. Sets
# $started_line.
start_daemon() {
  local name=$1 marker=$2
  shift 2
  local fifo=$work/$name.fifo
  mkfifo "$fifo"
  "$@" >"$fifo" 2>"$work/$name.log" &
  pids+=($!)
  exec {fd}<"$fifo"
  started_line=
  local line
  while IFS= read -r -t 30 -u "$fd" line; do
    echo "$line" >>"$work/$name.out"
    if [[ $line == *"$marker"* ]]; then started_line=$line; break; fi
  done
  if [[ -z $started_line ]]; then
    echo "main: $name did not print '$marker' within 30 s" >&2
    exec {fd}<&-
    return 1
  fi
  cat <&"$fd" >>"$work/$name.out" &
  exec {fd}<&-
}

coordinator_flags=()
worker_flags=()
shardctl_flags=()
if ((secure)); then
  echo "== --secure: TLS material (tools/dev_certs.sh) and bearer tokens"
  bash tools/dev_certs.sh "$work/certs" w0 w1 w2 w3
  head -c 32 /dev/urandom | base64 >"$work/admin.token"
  head -c 32 /dev/urandom | base64 >"$work/worker.token"
  {
    echo "admin main-admin $("$shardctl_bin" token hash <"$work/admin.token")"
    echo "worker main-workers $("$shardctl_bin" token hash <"$work/worker.token")"
  } >"$work/tokens"
  coordinator_flags=(--tls-cert="$work/certs/coordinator.pem" --tls-key="$work/certs/coordinator.key"
    --tls-ca="$work/certs/ca.pem" --tls-client-auth=require --auth-tokens="$work/tokens")
  worker_flags=(--tls-ca="$work/certs/ca.pem" --tls-client-auth=require
    --token-file="$work/worker.token")
  shardctl_flags=(--tls-cert="$work/certs/client.pem" --tls-key="$work/certs/client.key")
  export SHARDCOORD_TLS_CA=$work/certs/ca.pem
  SHARDCOORD_TOKEN=$(cat "$work/admin.token")
  export SHARDCOORD_TOKEN
fi

echo "== starting a coordinator and four CPU workers on loopback"
# The coordinator keeps meshes, tensors and worker ranks in SQLite (state.db) in this
# directory; a coordinator restarted on it recovers them (docs/decisions.md).
state_dir=$work/state
start_daemon coordinator "coordinator listening on " \
  "$coordinator_bin" --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 --state-dir="$state_dir" \
  ${coordinator_flags[@]+"${coordinator_flags[@]}"}
address=${started_line##*listening on }
address=${address%% *}
export SHARDCOORD_ADDR=$address
echo "coordinator at $address, state in $state_dir/state.db"
# Printed before the listening line: "coordinator metrics on http://HOST:PORT/metrics".
metrics_url=$(sed -n 's/^coordinator metrics on \(http:[^ ]*\).*/\1/p' "$work/coordinator.out")
if [[ -n $metrics_url ]]; then
  echo "metrics at $metrics_url, dashboard at ${metrics_url%/metrics}/"
fi
for i in 0 1 2 3; do
  own_flags=()
  ((secure)) && own_flags=(--tls-cert="$work/certs/w$i.pem" --tls-key="$work/certs/w$i.key")
  start_daemon "w$i" "worker w$i listening on " \
    "$worker_bin" --coordinator="$address" --listen=127.0.0.1:0 --name="w$i" --backend=gloo \
    --local-socket="$work/w$i.sock" ${worker_flags[@]+"${worker_flags[@]}"} ${own_flags[@]+"${own_flags[@]}"}
  echo "${started_line}"
done

shardctl() { "$shardctl_bin" ${shardctl_flags[@]+"${shardctl_flags[@]}"} "$@"; }
run() {
  echo
  echo "\$ shardctl $*"
  shardctl "$@"
}

# Registration follows the "listening" line; wait (30 s at most) until all four are ALIVE.
for _ in $(seq 300); do
  alive=$(shardctl workers --json | grep -o '"state": *"ALIVE"' | wc -l || true)
  ((alive >= 4)) && break
  sleep 0.1
done
run workers
((alive >= 4)) || { echo "main: only $alive of 4 workers registered" >&2; exit 1; }

# A step: shows the command and its answer, remembers the plan's time and bytes for the
# report, then shows the new layout.
steps=()
step() {
  local label=$1
  shift
  echo
  echo "== $label"
  echo "\$ shardctl $*"
  local out
  out=$(shardctl "$@")
  echo "$out"
  local secs moved bound
  secs=$(sed -n 's/.* in \([0-9.]*\) s$/\1/p' <<<"$out" | head -n1)
  moved=$(sed -n 's/^ *\(.*\) moved (lower bound \(.*\)),.*/\1/p' <<<"$out" | head -n1)
  bound=$(sed -n 's/^ *\(.*\) moved (lower bound \(.*\)),.*/\2/p' <<<"$out" | head -n1)
  steps+=("$(printf '%-34s %10s %14s %14s' "$label" "${secs:--}" "${moved:--}" "${bound:--}")")
  run tensor show T
}

run mesh create grid --shape 2x2 --dims dp,tp --workers w0,w1,w2,w3
run mesh create line --shape 4 --workers w0,w1,w2,w3
echo
echo "== create: 1024x1024 f32, S(0),R on the 2x2 mesh, arange"
run tensor create T --mesh grid --shape 1024,1024 --dtype f32 --placements 'S(0),R' --init arange
run tensor show T
step "S(0),R -> R,S(1) (2x2)" tensor redistribute T --placements 'R,S(1)'
step "-> S(1) on the 1-d mesh" tensor redistribute T --mesh line --placements 'S(1)'
step "-> S(0,[100,300,24,600]) (uneven)" tensor redistribute T --placements 'S(0,[100,300,24,600])'
step "-> flat (OLMo-core ranges)" tensor redistribute T \
  --flat '0:100000,1000000:1048576;100000:400000;400000:1000000;'
step "gather to rank 0" tensor gather T --to-rank 0

echo
echo "== download and check every value"
run tensor download T --out "$work/T.npy"
"$check_npy_bin" "$work/T.npy" --init arange --shape 1024,1024 --dtype f32

echo
echo "== report"
printf '%-34s %10s %14s %14s\n' "step" "plan s" "bytes moved" "lower bound"
printf '%s\n' "${steps[@]}"
if [[ -n $metrics_url ]] && command -v curl >/dev/null; then
  echo
  echo "== metrics (Prometheus text at $metrics_url)"
  curl -fsS "$metrics_url" | grep -E '^shardcoord_(plans_total|plan_bytes_moved_total|plan_lower_bound_bytes_total|workers|upload_bytes_total|download_bytes_total)[{ ]' || true
fi
echo
if ((secure)); then
  echo "main: OK (TLS with client certificates, bearer tokens): every value of the 1024x1024" \
    "tensor survived five moves"
else
  echo "main: OK: every value of the 1024x1024 tensor survived five moves"
fi
