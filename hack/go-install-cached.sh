#!/usr/bin/env bash
# go-install-cached.sh NAME MODULE VERSION: builds the Go command MODULE@VERSION (its binary
# named NAME) from the Go module proxy into a cache folder outside the clone keyed by the
# version, so a warm run returns at once. Prints the binary's path as its last line; progress
# goes to stderr. GO_LDFLAGS replaces the default "-s -w" (to stamp a version). Used by
# build-fake-gcs.sh, build-minio.sh and build-promtool.sh, which pin the versions.
set -euo pipefail
name=$1 module=$2 version=$3
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
out="$cache/$name-$version"
bin="$out/$name"
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
echo "building $name $version" >&2
GOBIN="$partial" go install -trimpath -ldflags "${GO_LDFLAGS:--s -w}" "$module@$version"
mv "$partial/$name" "$bin.partial"
mv "$bin.partial" "$bin"
rm -rf "$partial"
echo "  built $name in $(( $(date +%s) - start ))s" >&2
echo "$bin"
