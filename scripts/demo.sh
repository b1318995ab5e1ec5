#!/usr/bin/env bash
# The main job on a fresh machine: install system packages, build, run `testbed demo`
# (a 4-node cluster in network namespaces; a `prober gate` on it healthy, then while
# node-2 and node-3 are stuck in a dataplane apply loop, beside a long-lived mesh; the
# two side by side; teardown). Exit 0 when the healthy gate passed and the other failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --workspace --bins
exec "${CARGO_TARGET_DIR:-target}/release/testbed" demo "$@"
