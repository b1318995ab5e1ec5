#!/usr/bin/env bash
# Fetches the prometheus-operator CustomResourceDefinitions (ServiceMonitor,
# PrometheusRule, …) the `prometheus-operator` overlay and the Helm chart's toggles
# render objects of: they ship in the Go module `github.com/prometheus-operator/prometheus-operator`
# under `example/prometheus-operator-crd/`, so `go mod download` gets them with no
# registry other than the Go module proxy. Copied into the same cache as the real control
# plane (scripts/control-plane.sh), keyed by version. Prints the CRD directory on stdout.
#
#   bash scripts/prometheus-operator-crds.sh          # fetch or find cached; prints the directory
#   bash scripts/prometheus-operator-crds.sh --print  # only print the directory it would use
#
# Environment:
#   FIRSTPACKET_CONTROL_PLANE_CACHE           cache root (as scripts/control-plane.sh)
#   FIRSTPACKET_PROMETHEUS_OPERATOR_VERSION   override the pinned version (below)
set -euo pipefail

VERSION="${FIRSTPACKET_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
cache_root="${FIRSTPACKET_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket/control-plane}"
out="$cache_root/prometheus-operator-$VERSION/crds"

log() { echo "prometheus-operator-crds: $*" >&2; }

if [ "${1:-}" = "--print" ]; then echo "$out"; exit 0; fi
if [ -f "$out/monitoring.coreos.com_servicemonitors.yaml" ] && [ -f "$out/monitoring.coreos.com_prometheusrules.yaml" ]; then
  log "cached: $out"
  echo "$out"
  exit 0
fi
command -v go >/dev/null 2>&1 || { log "error: go not found"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "github.com/prometheus-operator/prometheus-operator@$VERSION" \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
src="$dir/example/prometheus-operator-crd"
[ -d "$src" ] || { log "error: no $src in github.com/prometheus-operator/prometheus-operator@$VERSION"; exit 1; }
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
cp "$src"/*.yaml "$out.tmp/"
rm -rf "$out"
mv "$out.tmp" "$out"
log "$(ls "$out" | wc -l) CRDs of prometheus-operator $VERSION in $out"
echo "$out"
