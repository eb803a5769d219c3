#!/usr/bin/env bash
# Runs the Python client's tests with Debian's python (grpcio, numpy). Arguments: the client
# module, the generated stubs, then tools/dev_certs.sh (runfiles paths; certificates for the
# TLS tests are made in $TEST_TMPDIR).
set -euo pipefail
python=/usr/bin/python3
if ! "$python" -c 'import grpc, numpy' 2>/dev/null; then
  echo "SKIP: $python lacks grpcio or numpy (apt-get install python3-grpcio python3-numpy)"
  exit 0
fi
client_dir=$(dirname "$1")
stubs_dir=$(cd "$(dirname "$2")/.." && pwd)  # The directory that holds proto/.
certs=${TEST_TMPDIR:-$(mktemp -d)}/certs
bash "${*: -1}" "$certs" w0 >/dev/null
SHARDCOORD_TEST_CERTS="$certs" SHARDCOORD_PY_STUBS="$stubs_dir" PYTHONPATH="$client_dir" exec "$python" \
  "$client_dir/shardcoord_client_test.py" -v
