#!/usr/bin/env bash
# Regenerates BENCHMARKS.md (one command): installs the system packages, builds the real
# control plane (its audit log counts the prober's API requests), the static
# target-server image binary and the release binaries, runs the parser benchmark
# (`cargo bench -p prober --bench expo`), then the testbed benchmark
# (`cargo bench -p testbed --bench firstpacket`), which prints every table and writes
# BENCHMARKS.md. Needs root (network namespaces). Takes about an hour on 2 cores.
#
#   bash scripts/bench.sh                    # everything, into BENCHMARKS.md
#   bash scripts/bench.sh --smoke --out /tmp/b.md   # one small iteration of each
#   bash scripts/bench.sh --only accuracy    # sections: accuracy,footprint,scale
#   bash scripts/bench.sh --only footprint --update   # re-run one section into BENCHMARKS.md
#
# Arguments are passed to the testbed benchmark (`--help` lists them).
set -euo pipefail
# cargo runs the benchmark in testbed/: relative --out paths are taken from here.
export FIRSTPACKET_BENCH_CWD=$PWD
cd "$(dirname "$0")/.."
log() { echo "bench.sh: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "needs root (network namespaces)"; exit 2; }
t0=$(date +%s)
bash scripts/setup.sh
bash scripts/control-plane.sh
bash scripts/image.sh target-server
cargo build --release --workspace --bins
mkdir -p target/bench
log "parser: cargo bench -p prober --bench expo"
cargo bench -p prober --bench expo | tee target/bench/expo.txt
log "testbed benchmark: cargo bench -p testbed --bench firstpacket -- $*"
cargo bench -p testbed --bench firstpacket -- --parser-output "$PWD/target/bench/expo.txt" "$@"
log "done in $(($(date +%s) - t0))s"
