#!/usr/bin/env bash
# Checks the Kubernetes manifests offline: renders every overlay of deploy/k8s with
# `kubectl kustomize` and validates every object against the Kubernetes OpenAPI schemas
# (npm's kubernetes-models, installed into deploy/node_modules by tools/setup.sh) plus
# shardcoord's own rules (deploy/validate.mjs). First it makes sure the validator rejects a
# broken object. Exit status non-zero on any failure. tools/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")"

command -v kubectl >/dev/null || { echo "check.sh: kubectl not found (it renders the kustomizations)" >&2; exit 1; }
command -v node >/dev/null || { echo "check.sh: node not found (tools/setup.sh installs nodejs)" >&2; exit 1; }
if [[ ! -d node_modules/kubernetes-models ]]; then
  npm ci --no-audit --no-fund --silent
fi

# The validator must fail on a broken object, or a pass means nothing.
broken=$(kubectl kustomize k8s/overlays/cpu | sed 's/containerPort: 7500/containerPort: "7500"/')
if node validate.mjs broken-self-test <<<"$broken" >/dev/null 2>&1; then
  echo "check.sh: the validator accepted a string containerPort" >&2
  exit 1
fi

status=0
overlays=0
for dir in k8s/overlays/*/; do
  overlay=$(basename "$dir")
  overlays=$((overlays + 1))
  if ! rendered=$(kubectl kustomize "$dir"); then
    echo "check.sh: overlay $overlay does not render" >&2
    status=1
    continue
  fi
  node validate.mjs "$overlay" <<<"$rendered" || status=1
done
((overlays >= 2)) || { echo "check.sh: expected the cpu and gpu overlays" >&2; exit 1; }
exit "$status"
