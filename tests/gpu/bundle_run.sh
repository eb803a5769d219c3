#!/usr/bin/env bash
# Runs a bundle made by tests/gpu/bundle.sh on a GPU machine (packed in as run.sh):
#
#   BUNDLE/run.sh [OUT_DIR]     # OUT_DIR (default ./gpu-out) gets the logs and nccl_bench.json
#
# 1. every GPU test (gtest), failing if one fails or skips for a reason other than needing
#    more GPUs; 2. nccl_bench --json; 3. worker_check.py: a coordinator and an NCCL worker,
#    uploads, groups and a checkpoint through device memory; 4. attach_check.py with the
#    machine's CUDA torch: a torch CUDA tensor lent to the worker and written in place.
# Prints one line per step and "gpu bundle: N passed, M failed" last; exits 1 if M > 0.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$PWD/gpu-out}
mkdir -p "$out"
log() { echo "run.sh: $*" >&2; }

nccl_dir=${NCCL_LIB_DIR:-}
if [[ -z "$nccl_dir" ]]; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
fi
if [[ -z "$nccl_dir" || ! -e "$nccl_dir/libnccl.so.2" ]]; then
  nccl_dir=$(dirname "$( (ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}') 2>/dev/null ||
    find / -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null || true)
fi
libpath="$here/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "glibc $(getconf GNU_LIBC_VERSION | cut -d' ' -f2), NCCL from ${nccl_dir:-nowhere}"
command -v nvidia-smi >/dev/null && nvidia-smi -L >&2

# The daemons as commands that carry the library path (python3 itself keeps its own).
mkdir -p "$here/wrapped"
for b in coordinator worker shardctl; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$libpath" "$here/bin/$b" >"$here/wrapped/$b"
  chmod +x "$here/wrapped/$b"
done
if LD_LIBRARY_PATH=$libpath ldd "$here/bin/worker" | grep -q 'not found'; then
  LD_LIBRARY_PATH=$libpath ldd "$here/bin/worker" | grep 'not found' >&2
fi

passed=0
failed=0
step() {  # step NAME RC
  if (($2 == 0)); then
    passed=$((passed + 1))
    log "$1: ok"
  else
    failed=$((failed + 1))
    log "$1: FAILED ($2)"
  fi
}

for t in cuda_status_test gpu_probe_test device_buffer_test cuda_memory_space_test kernels_test \
  nccl_communicator_gpu_test; do
  LD_LIBRARY_PATH=$libpath timeout 300 "$here/bin/$t" --gtest_color=no >"$out/$t.log" 2>&1
  rc=$?
  # Expected skips: the no-GPU case of DeviceBuffer and multi-rank tests on one GPU.
  if grep -E '^\[  SKIPPED \] [A-Za-z]' "$out/$t.log" | grep -vqE 'WithoutAGpu|NcclMultiRankTest'; then
    grep -E '^\[  SKIPPED \]' "$out/$t.log" >&2
    ((rc == 0)) && rc=3
  fi
  grep -E '^\[  PASSED  \]|^\[  FAILED  \] [A-Z]|^\[  SKIPPED \] [0-9]' "$out/$t.log" | sed "s/^/  $t /" >&2
  step "$t" "$rc"
done
cat "$out"/*_test.log >"$out/gpu_tests.log" && rm -f "$out"/*_test.log

LD_LIBRARY_PATH=$libpath timeout 300 "$here/bin/nccl_bench" --json >"$out/nccl_bench.json" \
  2>"$out/nccl_bench.log"
step nccl_bench $?
LD_LIBRARY_PATH=$libpath timeout 300 "$here/bin/nccl_bench" >&2 2>>"$out/nccl_bench.log"

for check in worker_check attach_check; do
  PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 \
    "$here/python/$check.py" --coordinator "$here/wrapped/coordinator" \
    --worker "$here/wrapped/worker" >"$out/$check.log" 2>&1
  rc=$?
  tail -5 "$out/$check.log" >&2
  step "$check" "$rc"
done
# The daemons' own logs (the cluster's temporary folders).
tar -czf "$out/daemon_logs.tar.gz" /tmp/sc-* 2>/dev/null || true

echo "gpu bundle: $passed passed, $failed failed"
((failed == 0))
