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
# Real Calico Felix (`testbed up --agent calico`) programs its iptables dataplane with
# iptables-nft-restore/-save and ipset (`iptables`, `ipset`); real kube-proxy
# (`--kube-proxy real`) runs in nftables mode and flushes stale UDP flows with `conntrack`.
command -v iptables-nft-restore >/dev/null 2>&1 || need+=(iptables)
command -v ipset >/dev/null 2>&1 || need+=(ipset)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
# containerd (with containerd-shim-runc-v2 and ctr) and runc: the real nodes of
# `testbed up --kubelet real` (their services are not started; the testbed runs one
# containerd per node with its own configuration).
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
# libfaketime: the testbed's clock_skew fault shifts pod wall clocks with it.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 ] || need+=(libfaketime)
# Prometheus, promtool, Alertmanager and amtool (Debian's packages): the alerting rules'
# checks and unit tests (testbed/tests/alerts.rs) and the end-to-end alerting test
# (testbed/tests/e2e_alerts.rs). The packages' services are not started (no systemd).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
# Chromium (Debian's package, headless): the end-to-end alerting test loads `prober run`'s
# status page under S4 with `chromium --headless --dump-dom` and saves a screenshot of it.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# A venv for scripts/render-panels.py (Debian's python3 needs python3-venv for it).
python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# matplotlib (pinned, from PyPI) for the dashboard panels' PNGs, in a cached venv.
bash "$(dirname "$0")/render-env.sh" >/dev/null
# junitparser (pinned), a JUnit consumer from PyPI: prober/tests/engine_baseline.rs parses the
# gate's --junit output with it. In a venv cached outside the checkout.
venv="${XDG_CACHE_HOME:-$HOME/.cache}/firstpacket/venv-junitparser-5.0.3"
if ! "$venv/bin/python3" -c 'import junitparser' >/dev/null 2>&1; then
  echo "setup: installing junitparser 5.0.3 into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'junitparser==5.0.3'
fi
