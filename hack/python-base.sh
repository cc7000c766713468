#!/usr/bin/env bash
# Makes the Python base image that images/*/Dockerfile and examples/Dockerfile take as
# PYTHON_IMAGE, from Debian's packages alone, where no container registry can be reached:
#   bash hack/python-base.sh            # prints the local tag, localhost/trainingrun-python:3.11-bookworm
# The root file system is bookworm with its python3 (3.11), venv, `python` (python-is-python3),
# CA certificates and netbase, made by mmdebstrap; pip and setuptools are installed from Debian's
# own wheels (python3-pip-whl, python3-setuptools-whl: what Debian's ensurepip uses in a venv; it
# refuses the system python) into /usr/local, as the official python image has them, so the
# Dockerfiles' `pip wheel`, `python -m venv` and `python -m pip uninstall pip setuptools wheel`
# work unchanged; Debian's EXTERNALLY-MANAGED marker is removed for the same reason.
# The tarball is cached under ${TRAININGRUN_CACHE:-~/.cache/trainingrun}/images, keyed by this
# script's commands (its package list and options are its inputs): a warm run only checks that
# buildah's storage holds the image made from that very tarball (label trainingrun.base-key).
# Delete the tarball to pick up Debian's newer point and security updates.
set -euo pipefail
tag=${PYTHON_BASE_TAG:-localhost/trainingrun-python:3.11-bookworm}
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
suite=bookworm
mirror=http://deb.debian.org/debian
packages=python3,python3-venv,python-is-python3,ca-certificates,netbase
# Its commands, comments left out: rewording a comment rebuilds nothing.
key=$(grep -v '^[[:space:]]*#' "$0" | sha256sum | cut -c1-12)
tarball="$cache/images/python-base-$suite-$key.tar"

if [ ! -f "$tarball" ]; then
  command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing: make node-packages" >&2; exit 1; }
  mkdir -p "$cache/images"
  partial="$cache/images/.partial-$key.tar"   # mmdebstrap writes a tarball for a name in .tar
  start=$(date +%s)
  echo "making the Python base image's root file system ($suite: $packages)" >&2
  # pip runs from its wheel to install itself, as ensurepip does.
  pip_hook=$(cat <<'HOOK'
env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin chroot "$1" sh -c \
  'whl=$(echo /usr/share/python-wheels/pip-*.whl) && python "$whl/pip" install --quiet \
  --root-user-action=ignore --no-index --find-links /usr/share/python-wheels pip setuptools'
HOOK
)
  # Docs, man pages and translations are dropped as dpkg unpacks (copyrights kept), as in
  # Debian's slim images; apt's lists are emptied by mmdebstrap itself.
  # The hooks' "$1" is the root file system, expanded by mmdebstrap's shell.
  # shellcheck disable=SC2016
  # The merged-usr hook makes /usr merged itself and installs usr-is-merged, so the usrmerge
  # package and the full perl it pulls stay out (49 MB of the image).
  mmdebstrap --variant=minbase --include="$packages" --quiet \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook="$pip_hook" \
    --customize-hook='find "$1"/usr -name __pycache__ -path "*/local/*" -prune -exec rm -rf {} +' \
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
  # What the official python image sets: a UTF-8 locale and python3 as the default command.
  buildah config --env LANG=C.UTF-8 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 --annotation "trainingrun.base-key=$key" \
    --label "org.opencontainers.image.description=Debian $suite with its python3, made by hack/python-base.sh" \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
  trap - EXIT
fi
echo "$tag"
