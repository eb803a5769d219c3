#!/usr/bin/env bash
# Builds every fuzz target (cc_fuzz_test, tag "fuzz") with --config=fuzz (clang 14, libFuzzer,
# ASan + UBSan) and runs each for a bounded number of runs, starting from its seed corpus in
# the repository (new inputs go to a scratch corpus; the seeds are not modified). A crash,
# sanitizer report, leak or slow input fails: the script names the target and the reproducer
# file, and exits 1. Replay a reproducer with `bazel-out/k8-fastbuildfuzz/bin/PKG/TARGET FILE`,
# or add it to the target's corpus (the normal `bazel test` then runs it too).
#
#   tools/fuzz.sh [TARGET...]     default: every fuzz target
#   FUZZ_RUNS_PERCENT=P           runs per target, in percent of the target's `runs`
#                                 (cc_fuzz_test; default 100: about a minute in all on 2 cores)
#   FUZZ_MAX_TIME=S               safety bound in seconds per target (default 30)
#   FUZZ_SEED=N                   libFuzzer's -seed (default 1, so a run is reproducible;
#                                 FUZZ_SEED=0 lets libFuzzer pick one)
#   FUZZ_OUT=DIR                  where reproducers and logs go (default a new temp dir)
set -uo pipefail
cd "$(dirname "$0")/.."

percent=${FUZZ_RUNS_PERCENT:-100}
max_time=${FUZZ_MAX_TIME:-30}
seed=${FUZZ_SEED:-1}
out=${FUZZ_OUT:-$(mktemp -d /tmp/shardcoord-fuzz.XXXXXX)}
mkdir -p "$out"

if (($# > 0)); then
  targets=("$@")
else
  mapfile -t targets < <(bazel query 'attr(tags, "\bfuzz\b", tests(//...))' 2>/dev/null)
fi
if ((${#targets[@]} == 0)); then
  echo "fuzz.sh: no fuzz targets found" >&2
  exit 1
fi
bazel build --config=fuzz "${targets[@]}" 2>&1 | grep -v "ld.gold: warning: Cannot export local symbol"
if ((PIPESTATUS[0] != 0)); then
  echo "fuzz.sh: build failed" >&2
  exit 1
fi
bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
start=$SECONDS
for t in "${targets[@]}"; do
  pkg=${t#//}
  pkg=${pkg%%:*}
  name=${t##*:}
  seeds=$pkg/${name}_corpus
  corpus=$out/corpus/$name
  log=$out/$name.log
  mkdir -p "$corpus"
  runs=$(bazel query --output=build "$t" 2>/dev/null | grep -o 'fuzz_runs=[0-9]*' | head -1)
  runs=$(( ${runs#fuzz_runs=} * percent / 100 ))
  t0=$SECONDS
  "$bin/$pkg/$name" -runs="$runs" -seed="$seed" -max_total_time="$max_time" -timeout=10 \
    -artifact_prefix="$out/$name-" -print_final_stats=1 "$corpus" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  if ((rc != 0)); then
    repro=$(ls -t "$out/$name-"* 2>/dev/null | head -1)
    echo "FAILED $t (exit $rc): reproducer ${repro:-none written}; log $log"
    grep -E 'ERROR|SUMMARY|runtime error|_fuzz: ' "$log" | head -5 | sed 's/^/    /'
    failed+=("$t")
  else
    echo "ok     $t: ${execs:-?} runs in $((SECONDS - t0))s"
  fi
done
echo "fuzz.sh: ${#targets[@]} targets, ${#failed[@]} failed, $((SECONDS - start))s of fuzzing; output in $out"
((${#failed[@]} == 0))
