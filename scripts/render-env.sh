#!/usr/bin/env bash
# Creates (once) the Python virtualenv of scripts/render-panels.py with the pinned
# packages of scripts/render-requirements.txt (matplotlib from PyPI), cached outside the
# checkout in ~/.cache/firstpacket/render-venv-<hash of the requirements>
# (FIRSTPACKET_RENDER_VENV_CACHE moves the cache), and prints its python's path.
# Seconds when cached; about 30 s to install.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req="$here/render-requirements.txt"
cache=${FIRSTPACKET_RENDER_VENV_CACHE:-$HOME/.cache/firstpacket}
hash=$(sha256sum "$req" | cut -c1-12)
venv="$cache/render-venv-$hash"
if [ ! -x "$venv/bin/python" ] || [ ! -e "$venv/.complete" ]; then
  echo "render-env: installing $(grep -c '==' "$req") pinned packages into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
