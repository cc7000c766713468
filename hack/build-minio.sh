#!/usr/bin/env bash
# Builds MinIO, the S3-compatible server the S3 store's tests also run against (tests/minio.py),
# from the Go module proxy into a cache folder outside the clone keyed by its version, so a
# warm run returns at once. Prints the binary's path as its last line; progress goes to stderr.
#
# MinIO publishes its server as source only; the module proxy serves its commits as
# pseudo-versions. The pinned one is the newest the proxy gave on 2026-11-28 (commit 7aac2a2c5b7c
# of 2026-02-12). Unlike SeaweedFS, it checks the SHA-256 a request signs for its body, and it
# lists a key's own unfinished uploads only, none under a folder's prefix (docs/storage.md).
# MINIO_VERSION builds another one beside it.
set -euo pipefail
version=${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}
module=github.com/minio/minio
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
out="$cache/minio-$version"
bin="$out/minio"
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
echo "building minio $version (a few minutes the first time)" >&2
GOBIN="$partial" go install -trimpath -ldflags "-s -w" "$module@$version"
mv "$partial/minio" "$bin.partial"
mv "$bin.partial" "$bin"
rm -rf "$partial"
echo "  built minio in $(( $(date +%s) - start ))s" >&2
echo "$bin"
