#!/usr/bin/env bash
# Makes the Debian base image that examples/Dockerfile takes as DEBIAN_IMAGE, from Debian's
# packages alone, where no container registry can be reached:
#   bash hack/trainer-base.sh           # prints the local tag, localhost/trainingrun-debian:trixie-slim
# It stands in for the registry's debian:trixie-slim: trixie's minbase (apt, dpkg, no docs, man
# pages or translations: its dpkg options stay in the image, so the Dockerfile's own apt-get
# install drops them too), made by mmdebstrap with an empty apt list, so the Dockerfile's
# `apt-get update && apt-get install python3-torch ...` runs here as it does with Docker. It adds
# ca-certificates (the Dockerfile installs them anyway): hack/build-images.sh bind-mounts the
# host's CA bundle over the image's, read-only, which the package's own setup could not rewrite.
# trixie, not bookworm: bookworm's python3-torch is 1.13, trixie's is 2.6 (CPU-only, Python 3.13).
# The tarball is cached under ${TRAININGRUN_CACHE:-~/.cache/trainingrun}/images, keyed by this
# script's commands; a warm run only checks that buildah's storage holds the image made from that
# very tarball (label trainingrun.base-key). Delete the tarball to pick up a newer point release.
set -euo pipefail
suite=trixie
tag=${TRAINER_BASE_TAG:-localhost/trainingrun-debian:$suite-slim}
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
mirror=http://deb.debian.org/debian
# Its commands, comments left out: rewording a comment rebuilds nothing.
key=$(grep -v '^[[:space:]]*#' "$0" | sha256sum | cut -c1-12)
tarball="$cache/images/debian-base-$suite-$key.tar"

if [ ! -f "$tarball" ]; then
  command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing: make node-packages" >&2; exit 1; }
  mkdir -p "$cache/images"
  partial="$cache/images/.partial-$key.tar"   # mmdebstrap writes a tarball for a name in .tar
  start=$(date +%s)
  echo "making the Debian base image's root file system ($suite minbase, ca-certificates)" >&2
  # As in Debian's slim images: docs, man pages and translations are dropped as dpkg unpacks
  # (copyrights kept); mmdebstrap keeps these options in /etc/dpkg/dpkg.cfg.d/99mmdebstrap.
  # The merged-usr hook makes /usr merged itself, without the usrmerge package and its perl.
  # The hook's "$1" is the root file system, expanded by mmdebstrap's shell.
  # shellcheck disable=SC2016
  mmdebstrap --variant=minbase --include=ca-certificates --quiet \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/log/apt/* "$1"/var/log/dpkg.log' \
    "$suite" "$partial" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" \
    "deb http://deb.debian.org/debian-security $suite-security main"
  mv "$partial" "$tarball"   # only a finished tarball gets the real name
  echo "  made $(du -m "$tarball" | cut -f1) MB in $(( $(date +%s) - start ))s" >&2
fi

have=$(buildah inspect --type image --format '{{index .ImageAnnotations "trainingrun.base-key"}}' \
  "$tag" 2>/dev/null || true)
if [ "$have" != "$key" ]; then
  echo "importing $tarball into buildah's storage as $tag" >&2
  ctr=$(buildah from scratch)
  trap 'buildah rm "$ctr" >/dev/null' EXIT
  buildah add --quiet "$ctr" "$tarball" /
  # What the registry's debian image sets: bash as the default command.
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --annotation "trainingrun.base-key=$key" \
    --label "org.opencontainers.image.description=Debian $suite minbase, made by hack/trainer-base.sh" \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
  trap - EXIT
fi
echo "$tag"
