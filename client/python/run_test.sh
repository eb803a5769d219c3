#!/usr/bin/env bash
# Runs a Python test of the `shardcoord` package with Debian's python (grpcio, numpy):
#   run_test.sh STUB_FILE PACKAGE_FILE SCRIPT [ARGS...]
# STUB_FILE is one of the generated stubs (//proto:shardcoord_py_gen), PACKAGE_FILE one file of
# client/python/shardcoord (runfiles paths). Skips (exit 0, saying why) without the modules.
set -euo pipefail
python=/usr/bin/python3
if ! "$python" -c 'import grpc, numpy' 2>/dev/null; then
  echo "SKIP: $python lacks grpcio or numpy (apt-get install python3-grpcio python3-numpy)"
  exit 0
fi
stubs_dir=$(cd "$(dirname "$1")" && pwd)
package_parent=$(cd "$(dirname "$2")/.." && pwd)
script=$3
shift 3
SHARDCOORD_PY_STUBS="$stubs_dir" PYTHONPATH="$package_parent" exec "$python" "$script" "$@"
