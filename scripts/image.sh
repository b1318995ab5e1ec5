#!/usr/bin/env bash
# Builds firstpacket's two container images without Docker: `target-server` (the probe
# pods' binary) and `prober`, each statically linked (glibc, `-C target-feature=+crt-static`
# on x86_64-unknown-linux-gnu; no musl target is installed) and packed by `crane` into a
# real OCI image: one layer holding the binary at /NAME, numeric non-root user
# 65532:65532, entrypoint = the binary, no shell, platform linux/amd64. The result is
# equivalent to building the `FROM scratch` Dockerfiles beside the crates
# (target-server/Dockerfile, prober/Dockerfile) with docker. With target-server comes a
# third image, `pause`: the same binary as user 65535 with entrypoint
# `/target-server pause`, the pod sandbox image of the testbed's real nodes
# (`testbed up --kubelet real`, containerd's `sandbox_image`).
#
#   bash scripts/image.sh            # build both images; prints the image directory
#   bash scripts/image.sh NAME…      # only these (target-server, prober)
#   bash scripts/image.sh --crane    # only build (or find cached) crane; prints its path
#   bash scripts/image.sh --print    # only print the image directory it would write
#
# Output, per image NAME (references ghcr.io/firstpacket/NAME:VERSION, VERSION = the
# workspace version in Cargo.toml), in the image directory:
#   NAME/             OCI image layout (oci-layout, index.json, blobs/sha256/…); index.json
#                     annotates the manifest with the full reference
#                     (`org.opencontainers.image.ref.name`, `io.containerd.image.name`)
#   NAME.oci.tar      the same layout as an OCI archive (what `skopeo copy oci-archive:…`,
#                     `podman load` and `ctr images import` read)
#   NAME.digest       the manifest digest (sha256:…)
# `testbed up` runs these images by default (its --image-dir defaults to this directory).
# Publishing: `crane push target/images/NAME ghcr.io/firstpacket/NAME:VERSION` (docs/src/install.md).
#
# The binaries are built with the release profile into their own target directory,
# outside the checkout like crane (FIRSTPACKET_IMAGE_TARGET_DIR, default
# ${XDG_CACHE_HOME:-~/.cache}/firstpacket/image-target): the dynamically linked dev/test
# builds in target/debug stay as they are (tests preload libfaketime into those), and a
# fresh clone recompiles only the workspace's crates (the dependencies' static release
# build takes minutes on two cores).
#
# crane (github.com/google/go-containerregistry/cmd/crane, pinned below) is built from its
# Go module into a cache outside the checkout, keyed by version; it packs the images
# through a registry it serves itself on 127.0.0.1 for the duration of the build (crane
# edits image configs only in a registry), then writes the layout with `crane pull
# --format oci`. Nothing leaves the machine.
#
# Environment:
#   FIRSTPACKET_IMAGE_DIR     output directory (default: <repo>/target/images, or
#                             $CARGO_TARGET_DIR/images when CARGO_TARGET_DIR is set)
#   FIRSTPACKET_TOOLS_CACHE   cache root for crane (default ${XDG_CACHE_HOME:-~/.cache}/firstpacket/tools)
#   FIRSTPACKET_CRANE_VERSION override the pinned crane version
#   FIRSTPACKET_IMAGE_TARGET_DIR  cargo target directory of the static build (see above)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

# The one place crane's version is pinned.
CRANE_VERSION="${FIRSTPACKET_CRANE_VERSION:-v0.22.1}"
TARGET=x86_64-unknown-linux-gnu
USER_ID=65532
NAMES=(target-server prober)
REGISTRY_PREFIX=ghcr.io/firstpacket

tools="${FIRSTPACKET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket/tools}"
target_dir="${FIRSTPACKET_IMAGE_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket/image-target}"
crane="$tools/crane-$CRANE_VERSION/crane"
# `images` beside the bin dir of the dev builds (where `testbed up` looks by default):
# <repo>/target/images, or $CARGO_TARGET_DIR/images when that is set.
cargo_target="${CARGO_TARGET_DIR:-$repo/target}"
case "$cargo_target" in /*) ;; *) cargo_target="$repo/$cargo_target" ;; esac
out="${FIRSTPACKET_IMAGE_DIR:-$cargo_target/images}"

log() { echo "image: $*" >&2; }
die() { log "error: $*"; exit 1; }

build_crane() {
  if [ -x "$crane" ]; then return 0; fi
  command -v go >/dev/null 2>&1 || die "go not found (Go is needed to build crane from its module)"
  local t0 tmp
  t0=$(date +%s)
  tmp="$tools/crane-$CRANE_VERSION.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "building crane $CRANE_VERSION from github.com/google/go-containerregistry/cmd/crane"
  CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}" GOBIN="$tmp" \
    go install -trimpath -ldflags "-s -w" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
  "$tmp/crane" version >/dev/null
  rm -rf "$tools/crane-$CRANE_VERSION"
  mv "$tmp" "$tools/crane-$CRANE_VERSION"
  log "built crane in $(($(date +%s) - t0))s: $crane"
}

case "${1:-}" in
  --print) echo "$out"; exit 0 ;;
  --crane) build_crane; echo "$crane"; exit 0 ;;
  "") ;;
  *)
    for n in "$@"; do
      case " ${NAMES[*]} " in *" $n "*) ;; *) die "unknown argument '$n' (use --crane, --print, or image names: ${NAMES[*]})" ;; esac
    done
    NAMES=("$@")
    ;;
esac

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$repo/Cargo.toml")
[ -n "$version" ] || die "no [workspace.package] version in $repo/Cargo.toml"
build_crane

t0=$(date +%s)
log "building ${NAMES[*]} (release, +crt-static, $TARGET) in $target_dir"
# One cargo build per package: built together, features unify (target-server's tokio
# would carry the prober's), and the image would depend on which others were built.
for n in "${NAMES[@]}"; do
  (cd "$repo" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --release --locked --target "$TARGET" --target-dir "$target_dir" --bins -p "$n")
done
bindir="$target_dir/$TARGET/release"
for n in "${NAMES[@]}"; do
  [ -x "$bindir/$n" ] || die "$bindir/$n was not built"
  # Static (static-pie with +crt-static on gnu): no program interpreter (PT_INTERP),
  # so nothing is loaded at run time.
  if readelf -lW "$bindir/$n" | grep -q 'INTERP'; then
    die "$bindir/$n is dynamically linked"
  fi
  log "$n: $(stat -c %s "$bindir/$n") bytes, static"
done
if [ -x "$bindir/target-server" ]; then
  ts_size=$(stat -c %s "$bindir/target-server")
  [ "$ts_size" -le 5000000 ] || die "target-server is $ts_size bytes, over the 5 MB budget (docs/design.md §7)"
fi
log "binaries built in $(($(date +%s) - t0))s"

work=$(mktemp -d)
reg_pid=
cleanup() {
  if [ -n "$reg_pid" ]; then kill "$reg_pid" 2>/dev/null || true; wait "$reg_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# A registry on loopback for the packing only (in memory; gone when this script exits).
"$crane" registry serve --address 127.0.0.1:0 2>"$work/registry.log" &
reg_pid=$!
port=
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$reg_pid" 2>/dev/null || die "crane registry serve exited: $(cat "$work/registry.log")"
  sleep 0.1
done
[ -n "$port" ] || die "crane registry serve did not report its port"
reg="127.0.0.1:$port"

mkdir -p "$out"
# pack IMAGE BINARY USER ENTRYPOINT…: one image of one static binary at /BINARY.
pack() {
  local n=$1 bin=$2 user=$3 entrypoint ref digest
  shift 3
  entrypoint=$(IFS=,; echo "$*")
  ref="$REGISTRY_PREFIX/$n:$version"
  mkdir -p "$work/$n"
  install -m 0755 "$bindir/$bin" "$work/$n/$bin"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$work/$n" -cf "$work/$n.layer.tar" "$bin"
  "$crane" append --oci-empty-base -f "$work/$n.layer.tar" -t "$reg/firstpacket/$n:stage" >/dev/null
  "$crane" mutate "$reg/firstpacket/$n:stage" \
    --entrypoint "$entrypoint" --user "$user:$user" --set-platform linux/amd64 \
    -l "org.opencontainers.image.title=$n" -l "org.opencontainers.image.version=$version" \
    -l "org.opencontainers.image.licenses=Apache-2.0" \
    -t "$reg/firstpacket/$n:$version" >/dev/null
  rm -rf "$out/$n" "$out/$n.oci.tar" "$out/$n.digest"
  "$crane" pull --format oci "$reg/firstpacket/$n:$version" "$work/layout-$n"
  digest=$("$crane" digest "$reg/firstpacket/$n:$version")
  jq --arg ref "$ref" '.manifests[0].annotations = {"org.opencontainers.image.ref.name": $ref, "io.containerd.image.name": $ref}' \
    "$work/layout-$n/index.json" > "$work/index.json"
  mv "$work/index.json" "$work/layout-$n/index.json"
  [ "$(jq -r '.manifests[0].digest' "$work/layout-$n/index.json")" = "$digest" ] || die "$n: layout digest differs from the registry's"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$work/layout-$n" -cf "$out/$n.oci.tar" oci-layout index.json blobs
  mv "$work/layout-$n" "$out/$n"
  echo "$digest" > "$out/$n.digest"
  log "$ref $digest -> $out/$n (layout), $out/$n.oci.tar"
}
for n in "${NAMES[@]}"; do
  pack "$n" "$n" "$USER_ID" "/$n"
done
# The pod sandbox image of the testbed's real nodes (`testbed up --kubelet real`:
# containerd's `sandbox_image`), Kubernetes' `pause` in role: target-server's `pause`
# mode, as the user Kubernetes' pause image runs as (65535).
case " ${NAMES[*]} " in
  *" target-server "*) pack pause target-server 65535 /target-server pause ;;
esac
log "done in $(($(date +%s) - t0))s"
echo "$out"
