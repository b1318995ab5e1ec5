#!/usr/bin/env bash
# Checks the workspace's declared minimum Rust version (`rust-version` in Cargo.toml's
# [workspace.package], inherited by every member) against what the locked dependencies
# declare: it must be at least the highest `rust-version` of any package in Cargo.lock's
# resolve (`cargo metadata --format-version 1 --locked`, every platform's dependencies,
# dev- and build-dependencies included), else `cargo build` with the declared toolchain
# fails ("package `kube v5.0.0` cannot be built because it requires rustc 1.89.0").
#
#   bash scripts/msrv.sh     # prints the declared and the needed version; exit 0 ok, 1 not
#
# Why metadata and not a build with that toolchain: only the toolchains installed here
# can be used (none can be downloaded in CI). What the workspace's own code needs of the
# standard library is checked by clippy's `incompatible_msrv` lint, which reads the same
# `rust-version` (`cargo clippy -- -D warnings` in CI); language features are not.
# Exit 2 when cargo metadata fails or a member declares no rust-version.
set -euo pipefail
cd "$(dirname "$0")/.."

meta=$(mktemp)
trap 'rm -f "$meta"' EXIT
if ! cargo metadata --format-version 1 --locked > "$meta"; then
  echo "msrv: cargo metadata --locked failed (is Cargo.lock up to date?)" >&2
  exit 2
fi
python3 - "$meta" <<'EOF'
import json, sys

meta = json.load(open(sys.argv[1]))
members = set(meta["workspace_members"])
resolved = {n["id"] for n in (meta.get("resolve") or {}).get("nodes", [])}

def version(v):
    """`1.89` or `1.89.0` as a comparable tuple (1, 89, 0)."""
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))

declared = {}
needed = []
for p in meta["packages"]:
    rv = p.get("rust_version")
    if p["id"] in members:
        if not rv:
            print(f"msrv: workspace member {p['name']} declares no rust-version", file=sys.stderr)
            sys.exit(2)
        declared[p["name"]] = rv
    elif rv and (not resolved or p["id"] in resolved):
        needed.append((version(rv), rv, f"{p['name']} {p['version']}"))

if len(set(declared.values())) != 1:
    print(f"msrv: the workspace members declare different rust-versions: {declared}", file=sys.stderr)
    sys.exit(2)
ours = next(iter(declared.values()))
if not needed:
    print(f"msrv: rust-version {ours}; no locked dependency declares one")
    sys.exit(0)
top = max(needed)[0]
who = sorted(n for v, _, n in needed if v == top)
need = max(needed)[1]
shown = ", ".join(who[:6]) + (f" and {len(who) - 6} more" if len(who) > 6 else "")
if version(ours) < top:
    print(
        f"msrv: Cargo.toml declares rust-version {ours}, but the locked dependencies need "
        f"{need} ({shown}): raise [workspace.package] rust-version to {need} "
        "(and the CI recipes' toolchain with it)",
        file=sys.stderr,
    )
    sys.exit(1)
print(f"msrv: rust-version {ours} covers the locked dependencies (highest: {need}, {shown})")
EOF
