#!/usr/bin/env bash
# Installs Azurite, Microsoft's Azure Storage emulator (the npm package), into a cache folder
# outside the clone, keyed by its version, so a warm run returns at once. The Azure store's tests
# run against its blob service (tests/azurite.py).
# 3.35.0 is the newest release that runs on Node 20 (the machine's node): 3.36 wants Node >= 21
# and 3.37 Node >= 22.
# Prints the path of the azurite-blob executable as its last line; progress goes to stderr.
set -euo pipefail
version=3.35.0
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
out="$cache/azurite-$version"
bin="$out/node_modules/.bin/azurite-blob"

if [ ! -x "$bin" ]; then
  command -v npm >/dev/null || { echo "npm not found: install Node.js 20 or later" >&2; exit 1; }
  start=$(date +%s)
  echo "installing azurite $version into $out" >&2
  rm -rf "$out.partial"
  mkdir -p "$out.partial"
  # --ignore-scripts: Azurite needs no install scripts, and none of its dependencies' run here.
  npm install --prefix "$out.partial" --no-audit --no-fund --ignore-scripts --no-save \
    --loglevel=error "azurite@$version" >&2
  rm -rf "$out"
  mv "$out.partial" "$out"   # only a finished install gets the real name
  echo "  installed azurite in $(( $(date +%s) - start ))s" >&2
fi
echo "$bin"
