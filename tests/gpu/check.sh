#!/usr/bin/env bash
# Runs the NCCL backend's GPU tests and GPU benchmark on a machine with one or more GPUs.
#
#   tests/gpu/check.sh [--json] [nccl_bench flags: --ranks N --min-bytes B --max-bytes B ...]
#
# 1. every test tagged "gpu" (single-rank communicators, kernels vs host code: copies,
#    reductions, casts and block quantization bitwise, device checksum == host checksum, and
#    multi-rank collectives when 2+ GPUs are visible), with their output, failing if any of
#    them skipped;
# 2. nccl_bench: each op's time, algbw and busbw (nccl-tests formulas), plus the pack and
#    checksum kernels; a table, or one JSON object with --json (on stdout; all else on stderr);
# 3. when nccl-tests' binaries are on PATH (or in $NCCL_TESTS_DIR), their all_gather,
#    reduce_scatter, all_reduce and broadcast bus bandwidth for the same sizes, to compare;
# 4. tests/gpu/worker_check.py: a coordinator and an NCCL worker; uploads, a copy group, a
#    gather group and a checkpoint through the worker's device memory, every value checked;
# 5. a real attach (tests/gpu/attach_check.py): a coordinator and an NCCL worker; a torch
#    process lends CUDA tensors (IPC handles) and checks a Copy wrote and read them in place.
#    It needs a python with a CUDA build of torch ($SHARDCOORD_PYTHON, /usr/bin/python3 or
#    python3 on PATH, the first whose torch sees a GPU).
# Exits 2 when no GPU is visible, 1 when a test or the benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! command -v bazel >/dev/null 2>&1; then
  echo "check.sh: bazel is not installed; run tools/setup.sh first (it needs Debian packages)" >&2
  exit 1
fi

json=0
bench_args=()
max_bytes=$((64 << 20))
ranks=""
for a in "$@"; do
  [[ "$a" == "--json" ]] && json=1
  bench_args+=("$a")
done
for ((i = 0; i < ${#bench_args[@]}; i++)); do
  case "${bench_args[$i]}" in
    --max-bytes) max_bytes="${bench_args[$((i + 1))]}" ;;
    --ranks) ranks="${bench_args[$((i + 1))]}" ;;
  esac
done

log() { echo "check.sh: $*" >&2; }

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L >&2 || true
fi

log "building the GPU targets"
bazel build -c opt //tests/gpu:nccl_bench >&2 || exit 1
bench="$(bazel info -c opt bazel-bin 2>/dev/null)/tests/gpu/nccl_bench"

# The benchmark's probe decides whether there is a GPU at all (exit 2 with the reason).
"$bench" --min-bytes 1024 --max-bytes 1024 --iters 1 --warmup 0 >/dev/null 2>/tmp/nccl_probe.$$
rc=$?
if ((rc == 2)); then
  cat /tmp/nccl_probe.$$ >&2
  rm -f /tmp/nccl_probe.$$
  exit 2
fi
rm -f /tmp/nccl_probe.$$

log "GPU tests"
testlog=$(mktemp)
trap 'rm -f "$testlog"' EXIT
bazel test --test_tag_filters=gpu --test_output=all //worker/comm/nccl/... //tests/gpu/... \
  >"$testlog" 2>&1
test_rc=$?
cat "$testlog" >&2
# Expected skips: the no-GPU check of DeviceBuffer, and multi-rank tests on one GPU.
skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$testlog" | grep -vE 'WithoutAGpu|NcclMultiRankTest' || true)
multi_skips=$(grep -cE 'needs [0-9]+ CUDA devices' "$testlog" || true)
if ((test_rc != 0)); then
  log "GPU tests FAILED"
fi
if [[ -n "$skipped" ]]; then
  # A visible GPU and still skipped: something is wrong with the environment.
  log "GPU tests skipped on a GPU machine:"
  echo "$skipped" >&2
  test_rc=1
fi
((multi_skips > 0)) && log "multi-rank tests skipped: they need 2+ GPUs"

log "benchmark"
"$bench" "${bench_args[@]}"
bench_rc=$?

# nccl-tests for comparison, same sizes (-b 1K -e max -f 4), one process driving every GPU.
nt_dir="${NCCL_TESTS_DIR:-}"
find_nt() { if [[ -n "$nt_dir" && -x "$nt_dir/$1" ]]; then echo "$nt_dir/$1"; else command -v "$1"; fi; }
if [[ -n "$(find_nt all_reduce_perf)" ]]; then
  ngpus=${ranks:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  for t in all_gather_perf reduce_scatter_perf all_reduce_perf broadcast_perf; do
    b=$(find_nt "$t") || continue
    log "nccl-tests $t (compare busbw with nccl_bench at the same size)"
    "$b" -b 1K -e "$max_bytes" -f 4 -g "${ngpus:-1}" -d float >&2 || true
  done
else
  log "nccl-tests not found (set NCCL_TESTS_DIR to compare against all_*_perf)"
fi

log "attach: a torch CUDA tensor lent to an NCCL worker"
python_rc=0
python=""
for p in "${SHARDCOORD_PYTHON:-}" /usr/bin/python3 "$(command -v python3 || true)"; do
  [[ -n "$p" && -x "$p" ]] || continue
  if "$p" -c 'import torch, grpc, numpy; assert torch.cuda.is_available()' 2>/dev/null; then
    python=$p
    break
  fi
done
if [[ -z "$python" ]]; then
  log "attach: no python with a CUDA torch, grpcio and numpy: not checked"
  python_rc=1
else
  bazel build -c opt //coordinator:coordinator //worker:worker >&2 || exit 1
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  # The worker's data paths on device memory (uploads, groups, a checkpoint), then the attach.
  for check in worker_check attach_check; do
    SHARDCOORD_PYTHON="$python" bash tools/python.sh "tests/gpu/$check.py" \
      --coordinator "$bin/coordinator/coordinator" --worker "$bin/worker/worker" >&2 ||
      python_rc=1
  done
fi

if ((test_rc != 0 || bench_rc != 0 || python_rc != 0)); then
  exit 1
fi
log "OK"
