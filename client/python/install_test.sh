#!/usr/bin/env bash
# Installs the `shardcoord` package as a user does (issue 29): a fresh venv of Debian's
# python3 with its site packages, `pip install --no-build-isolation` of client/python, offline;
# then, from / (no checkout on sys.path), checks that shardcoord.__version__ is client/version.h's,
# runs the layouts tests from the installed package (cross-checked against the real shardctl)
# and `python -m shardcoord.check` against a real coordinator and against nothing.
#   install_test.sh SHARDCTL COORDINATOR   (runfiles paths; the sources come from runfiles too)
set -euo pipefail
shardctl=$(realpath "$1")
coordinator=$(realpath "$2")
python=/usr/bin/python3
if ! "$python" -c 'import grpc, numpy, venv' 2>/dev/null; then
  echo "SKIP: $python lacks grpcio, numpy or venv (bash tools/setup.sh)"
  exit 0
fi
tmp=${TEST_TMPDIR:-$(mktemp -d)}
src=$tmp/src
# A copy of the checkout's pieces the build reads (runfiles are links into bazel-out).
mkdir -p "$src/client" "$src/proto"
cp -rL client/python "$src/client/"
cp -L client/version.h "$src/client/"
cp -L proto/shardcoord.proto "$src/proto/"
"$python" -m venv --system-site-packages "$tmp/venv"
PIP_NO_INDEX=1 "$tmp/venv/bin/pip" install -q --no-build-isolation "$src/client/python"
want=$(sed -n 's/.*kShardctlVersion\[\] = "\([^"]*\)".*/\1/p' client/version.h)
# The test script alone, away from the sources: Python puts a script's folder on sys.path.
mkdir -p "$tmp/tests"
cp -L client/python/layouts_test.py "$tmp/tests/"
layouts_test=$tmp/tests/layouts_test.py
cd /
got=$("$tmp/venv/bin/python" -c 'import shardcoord; print(shardcoord.__version__)')
if [[ $got != "$want" ]]; then
  echo "FAIL: shardcoord.__version__ is '$got', client/version.h says '$want'"
  exit 1
fi
echo "installed shardcoord $got"
where=$("$tmp/venv/bin/python" -c 'import shardcoord, os; print(os.path.dirname(shardcoord.__file__))')
if [[ $where != "$tmp/venv/"* ]]; then
  echo "FAIL: shardcoord imported from $where, not from the venv"
  exit 1
fi
"$tmp/venv/bin/python" "$layouts_test" --shardctl="$shardctl"

# No coordinator there: exit 1.
set +e
"$tmp/venv/bin/python" -m shardcoord.check 127.0.0.1:1
rc=$?
set -e
if ((rc != 1)); then
  echo "FAIL: shardcoord.check of nothing exited $rc, not 1"
  exit 1
fi
# A real coordinator: SERVING, exit 0.
cd "$tmp"
"$coordinator" --listen 127.0.0.1:0 --state memory --http-listen off >"$tmp/coordinator.out" \
  2>"$tmp/coordinator.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
addr=
for _ in $(seq 600); do  # Its listening line, within 60 s.
  addr=$(sed -n 's/^coordinator listening on //p' "$tmp/coordinator.out")
  [[ -n $addr ]] && break
  kill -0 $pid || { cat "$tmp/coordinator.log"; exit 1; }
  sleep 0.1
done
[[ -n $addr ]] || { echo "FAIL: the coordinator did not start"; exit 1; }
out=$("$tmp/venv/bin/python" -m shardcoord.check "$addr")
echo "$out"
if [[ $out != *"SERVING"* ]]; then
  echo "FAIL: shardcoord.check did not report SERVING"
  exit 1
fi
echo "install_test: OK"
