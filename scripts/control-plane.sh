#!/usr/bin/env bash
# Builds the real Kubernetes control plane the testbed runs with `--control-plane real`:
# kube-apiserver, kube-controller-manager and kube-scheduler from the `k8s.io/kubernetes`
# Go module, and etcd from `go.etcd.io/etcd/server/v3`, with `go build` (CGO off, as the
# official builds); also the node components of the same version and module, kube-proxy
# (`testbed up --kube-proxy real`) and kubelet (`--kubelet real`). The binaries go into a
# cache outside the checkout, keyed by version, so a second run costs nothing; a cache
# that lacks some of them builds only those. Prints the binary directory on stdout and
# exits 0.
#
#   bash scripts/control-plane.sh            # build or find cached; prints the directory
#   bash scripts/control-plane.sh --print    # only print the directory it would use
#
# Environment:
#   FIRSTPACKET_CONTROL_PLANE_CACHE  cache root (default ${XDG_CACHE_HOME:-~/.cache}/firstpacket/control-plane)
#   FIRSTPACKET_KUBERNETES_VERSION   override the pinned Kubernetes version (below)
#
# Why a wrapper module: k8s.io/kubernetes requires its ~33 staging modules (k8s.io/api,
# k8s.io/apiserver, ...) at v0.0.0 and maps them with `replace k8s.io/X => ./staging/...`;
# a dependent module ignores those replaces (kubernetes/kubernetes#79384), so the wrapper
# repeats each one pinned to the published v0.MINOR.PATCH, derived from that version's own
# go.mod. etcd is built in a second wrapper so its dependency versions cannot move
# kube-apiserver's; its version is the etcd client version kube-apiserver is built against.
set -euo pipefail

# The one place the Kubernetes version is pinned (1.36: the newest minor Go 1.26 builds).
KUBERNETES_VERSION="${FIRSTPACKET_KUBERNETES_VERSION:-v1.36.3}"

cache_root="${FIRSTPACKET_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket/control-plane}"
out="$cache_root/kubernetes-$KUBERNETES_VERSION"
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet)
bins=(etcd "${kube_bins[@]}")

log() { echo "control-plane: $*" >&2; }

have_all() {
  for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || return 1; done
  [ -f "$out/VERSIONS" ]
}

if [ "${1:-}" = "--print" ]; then echo "$out/bin"; exit 0; fi
if have_all; then
  log "cached: $out/bin ($(tr '\n' ' ' < "$out/VERSIONS"))"
  echo "$out/bin"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "error: go not found (Go >= 1.26 is needed to build the control plane)"; exit 1; }

case "$KUBERNETES_VERSION" in
  v1.*.*) ;;
  *) log "error: FIRSTPACKET_KUBERNETES_VERSION must look like v1.MINOR.PATCH, got '$KUBERNETES_VERSION'"; exit 1 ;;
esac
minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
patch="${KUBERNETES_VERSION##*.}"
staging_version="v0.$minor.$patch"

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
work="$cache_root/build-$KUBERNETES_VERSION"
rm -rf "$work" "$out/bin.tmp"
mkdir -p "$work/kubernetes" "$work/etcd" "$out/bin.tmp"
# Keep what an earlier run built (a cache from before kube-proxy and kubelet were added).
[ -d "$out/bin" ] && cp -a "$out/bin/." "$out/bin.tmp/"
t0=$(date +%s)

log "fetching k8s.io/kubernetes@$KUBERNETES_VERSION's go.mod"
kgomod=$(cd "$work/kubernetes" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
[ -f "$kgomod" ] || { log "error: could not download k8s.io/kubernetes@$KUBERNETES_VERSION"; exit 1; }

go_line=$(grep -m1 '^go ' "$kgomod")
godebug_line=$(grep -m1 '^godebug ' "$kgomod" || true)
etcd_version=$(sed -n 's/^\tgo.etcd.io\/etcd\/client\/v3 \(v[^ ]*\).*/\1/p' "$kgomod" | head -1)
[ -n "$etcd_version" ] || { log "error: no go.etcd.io/etcd/client/v3 requirement in $kgomod"; exit 1; }
# `k8s.io/X => ./staging/src/k8s.io/X` → `k8s.io/X => k8s.io/X v0.MINOR.PATCH`
replaces=$(sed -n 's/^\t\(k8s\.io\/[^ ]*\) => \.\/staging\/src\/\(k8s\.io\/[^ ]*\)$/\t\1 => \2 '"$staging_version"'/p' "$kgomod")
[ -n "$replaces" ] || { log "error: no staging replace directives found in $kgomod"; exit 1; }
log "Kubernetes $KUBERNETES_VERSION ($(echo "$replaces" | wc -l) staging modules at $staging_version), etcd $etcd_version"

cat > "$work/kubernetes/go.mod" <<EOF
module firstpacket.local/control-plane

$go_line

$godebug_line

require k8s.io/kubernetes $KUBERNETES_VERSION

replace (
$replaces
)

tool (
	k8s.io/kubernetes/cmd/kube-apiserver
	k8s.io/kubernetes/cmd/kube-controller-manager
	k8s.io/kubernetes/cmd/kube-scheduler
	k8s.io/kubernetes/cmd/kube-proxy
	k8s.io/kubernetes/cmd/kubelet
)
EOF

cat > "$work/etcd/go.mod" <<EOF
module firstpacket.local/etcd

$go_line

require go.etcd.io/etcd/server/v3 $etcd_version

tool go.etcd.io/etcd/server/v3
EOF

log "resolving modules (go mod tidy)"
(cd "$work/kubernetes" && go mod tidy)
(cd "$work/etcd" && go mod tidy)
t1=$(date +%s)
log "modules resolved in $((t1 - t0))s"

build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done
for b in "${kube_bins[@]}"; do
  [ -x "$out/bin.tmp/$b" ] && continue
  log "building $b (this is the slow part: minutes per binary on a cold cache)"
  tb=$(date +%s)
  (cd "$work/kubernetes" && go build -trimpath -ldflags "$kldflags" -o "$out/bin.tmp/$b" "k8s.io/kubernetes/cmd/$b")
  log "built $b in $(( $(date +%s) - tb ))s"
done
if [ ! -x "$out/bin.tmp/etcd" ]; then
  log "building etcd"
  tb=$(date +%s)
  (cd "$work/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcd" go.etcd.io/etcd/server/v3)
  log "built etcd in $(( $(date +%s) - tb ))s"
fi

"$out/bin.tmp/kube-apiserver" --version >&2
"$out/bin.tmp/etcd" --version >&2
rm -rf "$out/bin"
mv "$out/bin.tmp" "$out/bin"
printf 'kubernetes %s\netcd %s\n' "$KUBERNETES_VERSION" "$etcd_version" > "$out/VERSIONS"
rm -rf "$work"
log "done in $(( $(date +%s) - t0 ))s: $out/bin"
echo "$out/bin"
