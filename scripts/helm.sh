#!/usr/bin/env bash
# Builds `helm` (the Helm 3 CLI) from its Go module `helm.sh/helm/v3` with `go build`
# (CGO off, as the official builds), for the chart tests (`helm lint`, `helm template`,
# `helm install` into the testbed). The binary goes into the same cache as the real
# control plane (scripts/control-plane.sh), keyed by version, so a second run costs
# nothing. Prints the binary's path on stdout and exits 0.
#
#   bash scripts/helm.sh            # build or find cached; prints the path of helm
#   bash scripts/helm.sh --print    # only print the path it would use
#
# Environment:
#   FIRSTPACKET_CONTROL_PLANE_CACHE  cache root (default ${XDG_CACHE_HOME:-~/.cache}/firstpacket/control-plane)
#   FIRSTPACKET_HELM_VERSION         override the pinned Helm version (below)
set -euo pipefail

# The one place the Helm version is pinned.
HELM_VERSION="${FIRSTPACKET_HELM_VERSION:-v3.21.4}"

cache_root="${FIRSTPACKET_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket/control-plane}"
out="$cache_root/helm-$HELM_VERSION"

log() { echo "helm: $*" >&2; }

if [ "${1:-}" = "--print" ]; then echo "$out/bin/helm"; exit 0; fi
if [ -x "$out/bin/helm" ]; then
  log "cached: $out/bin/helm"
  echo "$out/bin/helm"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "error: go not found (Go >= 1.24 is needed to build helm)"; exit 1; }
case "$HELM_VERSION" in
  v3.*.*) ;;
  *) log "error: FIRSTPACKET_HELM_VERSION must look like v3.MINOR.PATCH, got '$HELM_VERSION'"; exit 1 ;;
esac

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
work="$cache_root/build-helm-$HELM_VERSION"
rm -rf "$work"
mkdir -p "$work" "$out/bin.tmp"
t0=$(date +%s)
# A wrapper module requiring exactly helm's release: its own go.mod pins every dependency.
cat > "$work/go.mod" <<EOF
module firstpacket.local/helm

go 1.24

require helm.sh/helm/v3 $HELM_VERSION

tool helm.sh/helm/v3/cmd/helm
EOF
log "resolving helm.sh/helm/v3@$HELM_VERSION"
(cd "$work" && go mod tidy)
log "building helm $HELM_VERSION"
# As helm's Makefile: the version `helm version` prints, and the Kubernetes version
# `helm template`/`helm lint` assume without a cluster (client-go v0.MINOR → 1.MINOR;
# unset, it is v1.20, below the chart's kubeVersion).
client_go=$(cd "$work" && go list -m -f '{{.Version}}' k8s.io/client-go)
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
(cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$out/bin.tmp/helm" helm.sh/helm/v3/cmd/helm)
"$out/bin.tmp/helm" version --short >&2
rm -rf "$out/bin"
mv "$out/bin.tmp" "$out/bin"
rm -rf "$work"
log "done in $(( $(date +%s) - t0 ))s: $out/bin/helm"
echo "$out/bin/helm"
