#!/usr/bin/env bash
# Builds real Calico Felix (`calico-felix`, the dataplane agent of calico-node) for the
# testbed's `--agent calico[:VERSION]`, from Calico's own sources: one build per source,
# keyed by the release version, into the cache beside the real control plane
# (scripts/control-plane.sh). Calico's releases are not on the Go module proxy, so a
# source is a checkout of https://github.com/projectcalico/calico at a release tag, or a
# `git archive` of one as .tar.gz; Felix's Go dependencies come from the module proxy.
#
#   FIRSTPACKET_CALICO_SOURCE=~/src/calico bash scripts/calico.sh        # a checkout at v3.31.7
#   FIRSTPACKET_CALICO_SOURCE=a.tar.gz,b.tar.gz bash scripts/calico.sh   # several versions
#   bash scripts/calico.sh --print                                       # the cache dir; built versions
#
# Per version it keeps `calico-vX.Y.Z/bin/calico-felix` (CGO off, stripped, version in the
# binary's build info: `calico-felix --version`) and `calico-vX.Y.Z/crd/*.yaml` (that
# version's CustomResourceDefinitions, libcalico-go/config/crd, which the testbed installs).
# A version already built costs nothing. Prints the versions it holds and exits 0.
#
# Environment:
#   FIRSTPACKET_CALICO_SOURCE         comma list of Calico source trees or .tar.gz archives (required)
#   FIRSTPACKET_CONTROL_PLANE_CACHE   cache root shared with the control plane
#                                     (default ${XDG_CACHE_HOME:-~/.cache}/firstpacket/control-plane)
set -euo pipefail

cache_root="${FIRSTPACKET_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket/control-plane}"
log() { echo "calico: $*" >&2; }

built_versions() {
  local d
  for d in "$cache_root"/calico-v*/; do
    [ -x "$d/bin/calico-felix" ] && [ -f "$d/VERSION" ] && basename "$d" | sed 's/^calico-//'
  done
  return 0
}

if [ "${1:-}" = "--print" ]; then
  echo "$cache_root"
  built_versions
  exit 0
fi

if [ -z "${FIRSTPACKET_CALICO_SOURCE:-}" ]; then
  log "error: FIRSTPACKET_CALICO_SOURCE is not set: name a checkout of github.com/projectcalico/calico at a release tag (or its .tar.gz), comma-separated for several versions"
  exit 1
fi
command -v go >/dev/null 2>&1 || { log "error: go not found (Go >= 1.25 builds Felix)"; exit 1; }

# version_of DIR: the release the tree is (git tag at HEAD, else the calico/node image tag
# its own manifests/calico.yaml pins, which the release tooling sets).
version_of() {
  local dir=$1 v=""
  if [ -d "$dir/.git" ] || [ -f "$dir/.git" ]; then
    v=$(git -C "$dir" describe --tags --exact-match 2>/dev/null || true)
  fi
  if [ -z "$v" ] && [ -f "$dir/manifests/calico.yaml" ]; then
    v=$(sed -n 's|^ *image: .*/calico/node:\(v[0-9][0-9.]*\)$|\1|p' "$dir/manifests/calico.yaml" | head -1)
  fi
  case "$v" in
    v3.*.*) echo "$v" ;;
    *) return 1 ;;
  esac
}

mkdir -p "$cache_root"
unpacked=""
out=""
# A failed unpack or build leaves nothing behind in the cache.
trap '[ -z "$unpacked" ] || rm -rf "$unpacked"; [ -z "$out" ] || rm -rf "$out.tmp"' EXIT
IFS=',' read -r -a sources <<< "$FIRSTPACKET_CALICO_SOURCE"
named=0
for src in "${sources[@]}"; do [ -n "$src" ] && named=$((named + 1)); done
[ "$named" -gt 0 ] || { log "error: FIRSTPACKET_CALICO_SOURCE names no source ('$FIRSTPACKET_CALICO_SOURCE')"; exit 1; }
for src in "${sources[@]}"; do
  [ -n "$src" ] || continue
  [ -e "$src" ] || { log "error: FIRSTPACKET_CALICO_SOURCE names $src, which does not exist"; exit 1; }
  unpacked=""
  if [ -f "$src" ]; then
    case "$src" in
      *.tar.gz|*.tgz) ;;
      *) log "error: $src is neither a directory nor a .tar.gz"; exit 1 ;;
    esac
    # The archive's name says its version (calico-vX.Y.Z.tar.gz); skip the unpacking when
    # that version is built already.
    guess=$(basename "$src" | sed -n 's/^calico-\(v3\.[0-9]*\.[0-9]*\)\.t.*$/\1/p')
    if [ -n "$guess" ] && [ -x "$cache_root/calico-$guess/bin/calico-felix" ] && [ -f "$cache_root/calico-$guess/VERSION" ]; then
      log "cached: $guess ($cache_root/calico-$guess)"
      continue
    fi
    unpacked=$(mktemp -d "$cache_root/unpack.XXXXXX")
    log "unpacking $src"
    if ! err=$(tar -xzf "$src" -C "$unpacked" 2>&1); then
      log "error: $src is not a readable .tar.gz: $(echo "$err" | grep -m1 .)"
      exit 1
    fi
    top=$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d | head -1)
    [ -n "$top" ] && [ -d "$top/felix/cmd/calico-felix" ] || { log "error: $src holds no felix/cmd/calico-felix"; rm -rf "$unpacked"; exit 1; }
    dir=$top
  else
    [ -d "$src/felix/cmd/calico-felix" ] || { log "error: $src is not a Calico source tree (no felix/cmd/calico-felix)"; exit 1; }
    dir=$src
  fi
  if ! version=$(version_of "$dir"); then
    log "error: cannot tell the Calico release of $src (no release tag at HEAD, no calico/node image tag in manifests/calico.yaml): check out a release tag, e.g. git checkout v3.31.7"
    [ -z "$unpacked" ] || rm -rf "$unpacked"
    exit 1
  fi
  out="$cache_root/calico-$version"
  if [ -x "$out/bin/calico-felix" ] && [ -f "$out/VERSION" ]; then
    log "cached: $version ($out)"
    [ -z "$unpacked" ] || rm -rf "$unpacked"
    continue
  fi
  log "building calico-felix $version from $src (minutes on a cold Go cache)"
  t0=$(date +%s)
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp/bin" "$out.tmp/crd"
  # The version variable moved: felix/buildinfo.GitVersion up to 3.29,
  # pkg/buildinfo.Version since (-X of a missing symbol is ignored, so set both).
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}" go build -trimpath \
    -ldflags "-s -w -X github.com/projectcalico/calico/pkg/buildinfo.Version=$version -X github.com/projectcalico/calico/felix/buildinfo.GitVersion=$version" \
    -o "$out.tmp/bin/calico-felix" ./felix/cmd/calico-felix)
  cp "$dir"/libcalico-go/config/crd/*.yaml "$out.tmp/crd/"
  if ! "$out.tmp/bin/calico-felix" --version 2>&1 | grep -q "Version: *$version\$"; then
    log "error: the built calico-felix does not report version $version (calico-felix --version: $("$out.tmp/bin/calico-felix" --version 2>&1 | head -1))"
    exit 1
  fi
  echo "$version" > "$out.tmp/VERSION"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  [ -z "$unpacked" ] || rm -rf "$unpacked"
  log "built $version in $(( $(date +%s) - t0 ))s: $out"
done
built_versions
