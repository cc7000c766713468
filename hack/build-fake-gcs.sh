#!/usr/bin/env bash
# Builds fake-gcs-server, the Google Cloud Storage emulator the GCS store's tests run against
# (tests/fakegcs.py), from the Go module proxy into a cache folder outside the clone keyed by
# its version, so a warm run returns at once. Prints the binary's path as its last line;
# progress goes to stderr.
#
# The version is pinned: the GCS store's tests rely on the emulator honouring ifGenerationMatch on
# resumable (v1.55.0) and simple uploads (v1.56.0) and checking a declared CRC32C (v1.55.0).
# v1.56.1 (2026-08-24) is the newest release on the module proxy. FAKE_GCS_VERSION builds
# another one beside it, to try a newer release before moving the pin.
set -euo pipefail
version=${FAKE_GCS_VERSION:-v1.56.1}
module=github.com/fsouza/fake-gcs-server
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
out="$cache/fake-gcs-server-$version"
bin="$out/fake-gcs-server"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$out"
# `go install module@version` names the binary itself, so it goes to a scratch GOBIN first and
# only a finished binary gets the real name.
partial="$out/.partial"
rm -rf "$partial"
mkdir -p "$partial"
start=$(date +%s)
echo "building fake-gcs-server $version" >&2
GOBIN="$partial" go install -trimpath -ldflags "-s -w" "$module@$version"
mv "$partial/fake-gcs-server" "$bin.partial"
mv "$bin.partial" "$bin"
rm -rf "$partial"
echo "  built fake-gcs-server in $(( $(date +%s) - start ))s" >&2
echo "$bin"
