#!/usr/bin/env bash
# Builds MinIO, the S3-compatible server the S3 store's tests also run against (tests/minio.py),
# from the Go module proxy into the cache (hack/go-install-cached.sh): about two minutes the
# first time. Prints the binary's path as its last line; progress goes to stderr.
#
# MinIO publishes its server as source only; the module proxy serves its commits as
# pseudo-versions. The pinned one is the newest the proxy gave on 2026-11-28 (commit 7aac2a2c5b7c
# of 2026-02-12). Unlike SeaweedFS, it checks the SHA-256 a request signs for its body, and it
# lists a key's own unfinished uploads only, none under a folder's prefix (docs/storage-s3.md).
# MINIO_VERSION builds another one beside it.
set -euo pipefail
exec bash "$(dirname "$0")/go-install-cached.sh" minio github.com/minio/minio \
  "${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
