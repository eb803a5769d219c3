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
  # The coordinator's durable state; etcd for several coordinators with a leader (tests
  # start Debian's etcd server; etcdctl to look at what they stored).
  libsqlite3-dev etcd-server etcd-client
  # The daemons' allocator (third_party:tcmalloc).
  libtcmalloc-minimal4
  # TLS material for development and tests (tools/dev_certs.sh).
  openssl
  # The dashboard's browser test (headless) and its PNG check.
  chromium zlib1g-dev
  # Peers for benchmarks and the Python client.
  python3-grpcio python3-numpy python3-torch
  # The Python package built and installed into a venv offline (//tests:python_package_test).
  python3-venv python3-pip python3-setuptools python3-wheel
  # //tests:prometheus_test lints both daemons' /metrics (promtool) and scrapes a live cluster
  # with a real Prometheus server on loopback.
  prometheus
  # grpc.health.v1's .proto (test and probe stubs; the service itself is in libgrpc++).
  grpc-proto
  # The image's root filesystem (deploy/image/build.sh; //tests:multihost_test runs from it)
  # and the multi-host test's namespaces, links and rate limits.
  mmdebstrap iproute2 util-linux
  # deploy/check.sh validates the Kubernetes manifests with npm's kubernetes-models.
  nodejs
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

# deploy/check.sh's validator, from npm into deploy/node_modules (not in git); again when the
# lock file changed.
# Debian's nodejs has no npm (other builds of nodejs bundle it): only when it is missing.
if ! command -v npm >/dev/null; then
  echo "setup: installing npm" >&2
  DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -qq --no-install-recommends npm >/dev/null || true
fi
if command -v npm >/dev/null; then
  deploy="$(cd "$(dirname "$0")/../deploy" && pwd)"
  stamp=$deploy/node_modules/.package-lock.json
  if [[ ! -e $stamp || $deploy/package-lock.json -nt $stamp ]]; then
    echo "setup: installing deploy/node_modules (npm ci)" >&2
    (cd "$deploy" && npm ci --no-audit --no-fund --silent)
  fi
else
  echo "setup: note: npm not found; deploy/check.sh will fail" >&2
fi
if ! command -v kubectl >/dev/null; then
  echo "setup: note: kubectl not found; deploy/check.sh renders the manifests with it" >&2
fi

if [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
  echo "setup: note: /usr/local/cuda has no nccl.h; the NCCL backend will not be built" >&2
fi
