#!/usr/bin/env bash
# Builds the project's images from their Dockerfiles, with Docker where its engine answers, else
# with buildah (Debian's package, installed when missing), which needs neither a daemon nor a
# registry:
#   bash hack/build-images.sh [operator] [agent] [finetune]     # default: all three
# Names and tag: OPERATOR_IMAGE, AGENT_IMAGE, FINETUNE_IMAGE, IMAGE_TAG (dev); IMAGE_BUILDER=docker
# or buildah picks one. With buildah the bases are made locally from Debian's packages, so
# images/*/Dockerfile and examples/Dockerfile stay the one recipe: the operator's and the agent's
# Python base (PYTHON_IMAGE) by hack/python-base.sh, the example trainer's Debian trixie base
# (DEBIAN_IMAGE) by hack/trainer-base.sh, each unless set. RUN steps use the host's network (apt
# reaches Debian's archive, pip PyPI) and buildah's layer cache, so a warm build with unchanged
# inputs takes seconds.
# Prints one line per image: NAME:TAG, its size and build time.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
tag=${IMAGE_TAG:-dev}
declare -A recipe=(
  [operator]=images/operator/Dockerfile
  [agent]=images/agent/Dockerfile
  [finetune]=examples/Dockerfile
  [finetune-user]=tests/e2e/Dockerfile.user
)
declare -A name=(
  [operator]=${OPERATOR_IMAGE:-ghcr.io/trainingrun/operator}
  [agent]=${AGENT_IMAGE:-ghcr.io/trainingrun/agent}
  [finetune]=${FINETUNE_IMAGE:-ghcr.io/trainingrun/finetune-example}
  [finetune-user]=${FINETUNE_IMAGE:-ghcr.io/trainingrun/finetune-example}
)
# finetune-user: the example image with a USER of its own (the real node's users test), tagged
# <tag>-user and built from the example image of the same tag (build finetune first).
declare -A suffix=([finetune-user]=-user)
[ $# -gt 0 ] || set -- operator agent finetune
for image in "$@"; do
  [ -n "${recipe[$image]:-}" ] || { echo "no such image: $image (operator, agent, finetune, finetune-user)" >&2; exit 2; }
done

builder=${IMAGE_BUILDER:-}
if [ -z "$builder" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    builder=docker
  else
    builder=buildah
  fi
fi
if [ "$builder" = buildah ]; then
  bash "$here/install-node-packages.sh" images   # buildah and mmdebstrap, when missing
fi

# The base each recipe takes, as a build argument.
declare -A base_arg=(
  [operator]=PYTHON_IMAGE
  [agent]=PYTHON_IMAGE
  [finetune]=DEBIAN_IMAGE
  [finetune-user]=FINETUNE_IMAGE
)
declare -A base=(
  [PYTHON_IMAGE]=${PYTHON_IMAGE:-}
  [DEBIAN_IMAGE]=${DEBIAN_IMAGE:-}
  [FINETUNE_IMAGE]=${name[finetune]}:$tag
)
args=()
if [ "$builder" = buildah ]; then
  # --layers: reuse each step whose inputs are unchanged; --force-rm: a failed build leaves no
  # working container (and its overlay mount) behind; --network host: apt and pip reach their
  # archives with no CNI network of buildah's own (no bridge, no iptables rules left behind).
  args=(bud --layers --force-rm --network host)
  # Where the host's pip trusts a CA bundle of its own (PIP_CERT or pip.conf's cert: a proxy that
  # inspects TLS), the build's pip needs it too: Debian's pip reads the system bundle, so the
  # host's is bind-mounted over it for the RUN steps only (a mount is never part of a layer).
  cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    args+=(--volume "$cert:/etc/ssl/certs/ca-certificates.crt:ro")
  fi
else
  args=(build)
fi

cd "$root"
for image in "$@"; do
  ref="${name[$image]}:$tag${suffix[$image]:-}"
  arg=${base_arg[$image]}
  if [ "$builder" = buildah ] && [ -z "${base[$arg]}" ]; then
    # Made (or found in the cache) once per run, for the first image that needs it.
    case $arg in
      PYTHON_IMAGE) base[$arg]=$(bash "$here/python-base.sh") ;;
      DEBIAN_IMAGE) base[$arg]=$(bash "$here/trainer-base.sh") ;;
    esac
  fi
  image_args=()
  [ -n "${base[$arg]}" ] && image_args=(--build-arg "$arg=${base[$arg]}")
  start=$(date +%s)
  echo "building $ref from ${recipe[$image]} with $builder" >&2
  "$builder" "${args[@]}" "${image_args[@]}" -f "${recipe[$image]}" -t "$ref" . >&2
  if [ "$builder" = buildah ]; then
    size=$(buildah images --noheading --format '{{.Size}}' "$ref")
  else
    size=$(docker image inspect --format '{{.Size}}' "$ref")
  fi
  echo "$ref size=$size built_in=$(( $(date +%s) - start ))s"
done
