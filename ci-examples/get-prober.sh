#!/usr/bin/env bash
# Puts the `prober` binary on a CI runner, for the recipes beside this file
# (github-actions.yml, gitlab-ci.yml): run from the directory holding the firstpacket
# checkout `firstpacket/`, it installs `prober` into ${CARGO_HOME:-~/.cargo}/bin (on the
# PATH of GitHub's ubuntu runners and of the rust images), then prints `prober --version`.
#
#   FIRSTPACKET_IMAGE_REGISTRY=registry.example.com/firstpacket bash firstpacket/ci-examples/get-prober.sh
#       the static binary out of the prober image you pushed there
#       (REGISTRY/prober:VERSION, VERSION = the workspace version in Cargo.toml), with
#       `crane export`: seconds. crane is taken from the PATH, else downloaded from
#       go-containerregistry's GitHub release (the version scripts/image.sh pins). A
#       private registry: `crane auth login` first (or a ~/.docker/config.json).
#   bash firstpacket/ci-examples/get-prober.sh
#       (no registry) built from source: `cargo install --locked --path
#       firstpacket/prober`, about 8 minutes on two cores; needs Rust at least the
#       workspace's rust-version (Cargo.toml; `bash scripts/msrv.sh` checks it).
#
# Exit 1 with the reason when the image cannot be read or holds no /prober.
set -euo pipefail
repo=firstpacket
registry="${FIRSTPACKET_IMAGE_REGISTRY:-}"
bin="${CARGO_HOME:-$HOME/.cargo}/bin"
mkdir -p "$bin"

if [ -z "$registry" ]; then
  cargo install --locked --path "$repo/prober"
else
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
  image="$registry/prober:$version"
  crane=$(command -v crane || true)
  if [ -z "$crane" ]; then
    pin=$(sed -n 's/^CRANE_VERSION="${FIRSTPACKET_CRANE_VERSION:-\(v[0-9.]*\)}"$/\1/p' "$repo/scripts/image.sh")
    tmp=$(mktemp -d)
    curl -fsSL "https://github.com/google/go-containerregistry/releases/download/$pin/go-containerregistry_Linux_x86_64.tar.gz" \
      | tar -xz -C "$tmp" crane
    crane="$tmp/crane"
  fi
  # The image's one layer holds the static binary at /prober.
  if ! "$crane" export "$image" - | tar -xOf - prober > "$bin/prober.tmp"; then
    rm -f "$bin/prober.tmp"
    echo "get-prober: could not read /prober out of $image (pushed? crane auth login?)" >&2
    exit 1
  fi
  chmod 755 "$bin/prober.tmp"
  mv "$bin/prober.tmp" "$bin/prober"
  echo "get-prober: $bin/prober from $image" >&2
fi
"$bin/prober" --version
