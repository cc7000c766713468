#!/usr/bin/env bash
# Builds fake-gcs-server, the Google Cloud Storage emulator the GCS store's tests run against
# (tests/fakegcs.py), from the Go module proxy into the cache (hack/go-install-cached.sh).
# Prints the binary's path as its last line; progress goes to stderr.
#
# The version is pinned: the GCS store's tests rely on the emulator honouring ifGenerationMatch on
# resumable (v1.55.0) and simple uploads (v1.56.0) and checking a declared CRC32C (v1.55.0).
# v1.56.1 (2026-08-24) is the newest release on the module proxy. FAKE_GCS_VERSION builds
# another one beside it, to try a newer release before moving the pin.
set -euo pipefail
exec bash "$(dirname "$0")/go-install-cached.sh" fake-gcs-server github.com/fsouza/fake-gcs-server \
  "${FAKE_GCS_VERSION:-v1.56.1}"
