#!/usr/bin/env bash
# Installs, from Debian's packages, what building images without Docker and running a real node
# need (issue 46). Nothing else is downloaded: the base image is made from Debian's archive
# (hack/python-base.sh), the kubelet and CoreDNS from Go modules (hack/build-node.sh).
#   buildah                      builds images/*/Dockerfile and examples/Dockerfile without Docker
#   mmdebstrap                   makes the Python base image's root file system from bookworm
#   containerd, runc             the node's container runtime (containerd 1.6: CRI v1)
#   containernetworking-plugins  bridge, host-local, loopback, portmap in /usr/lib/cni
#   iptables                     the CNI bridge and portmap plugins write NAT rules with it
#   bash hack/install-node-packages.sh [images]   # images: buildah and mmdebstrap alone
# Installs only what is missing, so a warm run returns at once. Root only (apt-get).
set -euo pipefail
packages=(buildah mmdebstrap containerd runc containernetworking-plugins iptables)
[ "${1:-}" = images ] && packages=(buildah mmdebstrap)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing ${missing[*]} (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's containerd package may start its service where an init system runs; the project's
# node starts its own containerd with its own config and state (hack/node-up.sh), never this one.
