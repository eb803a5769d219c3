#!/usr/bin/env bash
# Installs every Debian package shardcoord needs. Idempotent: when everything is already
# installed it only runs dpkg-query and returns in well under a second.
set -euo pipefail

PACKAGES=(
  # Build: Bazel 4 from Debian (offline), its Java rules, compilers.
  bazel-bootstrap bazel-rules-java g++ clang-14 libclang-rt-14-dev clang-format-14
  # RPC and serialisation.
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  # Core libraries.
  libabsl-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libgloo-dev libcli11-dev libxxhash-dev libssl-dev libcpp-httplib-dev
  # The coordinator's durable state.
  libsqlite3-dev
  # TLS material for development and tests (tools/dev_certs.sh).
  openssl
  # The dashboard's browser test (headless) and its PNG check.
  chromium zlib1g-dev
  # Peers for benchmarks and the Python client.
  python3-grpcio python3-numpy python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
  echo "setup: note: /usr/local/cuda has no nccl.h; the NCCL backend will not be built" >&2
fi
