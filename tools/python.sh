#!/usr/bin/env bash
# Runs Debian's Python (/usr/bin/python3: python3-grpcio, python3-numpy, python3-torch; or
# $SHARDCOORD_PYTHON, e.g. an interpreter with a CUDA build of torch) with the
# `shardcoord` package (client/python/shardcoord) importable, after generating its protobuf
# and gRPC stubs when they are missing or older than proto/shardcoord*.proto (protoc and
# grpc_python_plugin from protobuf-compiler-grpc; no Bazel needed).
#
#   tools/python.sh my_script.py ARGS        # any python3 arguments
#   tools/python.sh -c 'import shardcoord; print(shardcoord.connect().workers())'
#   tools/python.sh --pythonpath             # prints the PYTHONPATH entry for another interpreter
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pkg="$root/client/python/shardcoord"
gen="$pkg/_gen"
protos=("$root"/proto/shardcoord*.proto)  # shardcoord.proto and the files it imports.

stale=0
for proto in "${protos[@]}"; do
  [[ ! -f "$gen/shardcoord_pb2_grpc.py" || "$proto" -nt "$gen/shardcoord_pb2_grpc.py" ]] && stale=1
done
if ((stale)); then
  for tool in protoc grpc_python_plugin; do
    if ! command -v "$tool" >/dev/null; then
      echo "tools/python.sh: $tool is missing (apt-get install protobuf-compiler protobuf-compiler-grpc, or bash tools/setup.sh)" >&2
      exit 2
    fi
  done
  tmp=$(mktemp -d "$pkg/.gen.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  protoc --proto_path="$root/proto" --python_out="$tmp" --grpc_python_out="$tmp" \
    --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" "${protos[@]}"
  rm -rf "$gen"
  mv "$tmp" "$gen"   # Whole or not at all: a concurrent run sees old or new stubs.
  trap - EXIT
fi

if [[ "${1:-}" == "--pythonpath" ]]; then
  echo "$root/client/python"
  exit 0
fi
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
exec "${SHARDCOORD_PYTHON:-/usr/bin/python3}" "$@"
