#!/usr/bin/env bash
# Installs the system packages firstpacket's testbed and tests need (Debian/Ubuntu, as root).
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v curl >/dev/null 2>&1 || need+=(curl)
# scripts/image.sh: jq edits the image index, readelf checks the binaries are static.
command -v jq >/dev/null 2>&1 || need+=(jq)
command -v readelf >/dev/null 2>&1 || need+=(binutils)
# libfaketime: the testbed's clock_skew fault shifts pod wall clocks with it.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 ] || need+=(libfaketime)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
