#!/usr/bin/env bash
# Builds the docs book (mdBook: docs/book.toml, docs/src/) into target/book/ and checks its
# links: every relative link and every #anchor of the built HTML, and README.md's links
# into the repository. Both tools are installed from crates.io with `cargo install
# --locked` at pinned versions into a cache outside the checkout, once (minutes cold,
# seconds cached); the link checker is lychee (offline: no network request, local files
# and fragments only).
#
#   bash scripts/book.sh            # install when missing, build, check links
#   bash scripts/book.sh --install  # only install; print the two binaries' paths
#
# Exit 0 when the book built and every link resolves; non-zero otherwise (mdbook names a
# chapter it cannot build; lychee lists each broken link with the file and line it is in).
#
# Environment:
#   FIRSTPACKET_TOOLS_CACHE  cache root (default ${XDG_CACHE_HOME:-~/.cache}/firstpacket)
set -euo pipefail
cd "$(dirname "$0")/.."

# The one place the versions are pinned. mdBook 0.5 needs Rust >= 1.88, lychee 0.24 too.
MDBOOK_VERSION=0.5.4
LYCHEE_VERSION=0.24.2

cache="${FIRSTPACKET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket}"
mdbook="$cache/mdbook-$MDBOOK_VERSION/bin/mdbook"
lychee="$cache/lychee-$LYCHEE_VERSION/bin/lychee"

log() { echo "book: $*" >&2; }

# install CRATE VERSION ROOT [cargo install flags…]: `cargo install` into ROOT unless its
# binary is there. Only the features used are built: mdBook without its `serve` and
# `watch` (a web server and a file watcher; `search` kept for the book's search box),
# lychee without `email-check` (mail-server probing: the check is offline). Both with the
# dev profile (`--debug`): half the cold build of the release profile (measured here, both
# tools: 297 s of CPU, 9 min on 2 busy cores, against 616 s), and the runs stay about a
# second on this book.
install() {
  local crate=$1 version=$2 root=$3 t0
  shift 3
  if [ -x "$root/bin/$crate" ]; then
    return
  fi
  command -v cargo >/dev/null 2>&1 || { log "error: cargo not found (needed to install $crate $version)"; exit 1; }
  t0=$(date +%s)
  log "installing $crate $version into $root (cargo install --locked; once)"
  # Into a temporary root first, so an interrupted build never looks installed.
  rm -rf "$root.tmp"
  cargo install "$crate" --version "=$version" --locked --debug --root "$root.tmp" "$@" >&2
  rm -rf "$root"
  mv "$root.tmp" "$root"
  log "$crate $version installed in $(($(date +%s) - t0))s"
}

install mdbook "$MDBOOK_VERSION" "$cache/mdbook-$MDBOOK_VERSION" --no-default-features --features search
install lychee "$LYCHEE_VERSION" "$cache/lychee-$LYCHEE_VERSION" --no-default-features
if [ "${1:-}" = "--install" ]; then
  echo "$mdbook"
  echo "$lychee"
  exit 0
fi

t0=$(date +%s)
rm -rf target/book
"$mdbook" build docs
log "mdbook build docs: $(($(date +%s) - t0))s"

# The built HTML (every page's links and anchors, print.html's too) and README.md (its
# links and #anchors into docs/src/ and the repository, as GitHub renders them).
t0=$(date +%s)
"$lychee" --offline --include-fragments --no-progress \
  --root-dir "$PWD/target/book" \
  'target/book/**/*.html' README.md
log "links checked: $(($(date +%s) - t0))s"
