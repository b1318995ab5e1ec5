#!/usr/bin/env bash
# The main job on a fresh machine: install system packages, build, run `testbed demo`
# (a 3-node cluster in network namespaces, a `prober gate` run, the report, teardown).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --workspace --bins
exec "${CARGO_TARGET_DIR:-target}/release/testbed" demo "$@"
