#!/usr/bin/env bash
# Builds what a real node of the local environment runs besides Debian's containerd, runc and CNI
# plugins (make node-packages), into cache folders outside the clone keyed by their inputs, so a
# warm run returns at once (issue 46):
#   node-<key>/     kubelet, kube-proxy: the Kubernetes release of hack/k8s (the control plane's),
#                   from the wrapper module hack/node; Go's build cache shares the packages the
#                   control plane build compiled already
#   coredns-<key>/  coredns, with the plugins hack/coredns/main.go names (kubernetes among them)
#   pause-<key>/    pause (hack/pause) and pause.tar, an OCI image of it alone made with buildah
#                   from scratch, tagged $PAUSE_IMAGE: the sandbox image hack/node/containerd.toml
#                   names, imported into containerd's k8s.io namespace so nothing is pulled
# Links the binaries into the bin folder hack/build-tools.sh fills and prints it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
pause_image=${PAUSE_IMAGE:-localhost/trainingrun/pause:1}
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod

for tool in go buildah containerd runc; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: make node-packages (Go >= 1.26 by hand)" >&2; exit 1; }
done
[ -x /usr/lib/cni/bridge ] || { echo "the CNI plugins are missing: make node-packages" >&2; exit 1; }

# version_of MODULE_DIR MODULE_PATH: the version the wrapper's go.mod requires (in a block, or on
# a lone `require` line as `go mod tidy` writes one).
version_of() {
  awk -v m="$2" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' \
    "$1/go.mod"
}

# build MODULE_DIR LDFLAGS NAME=PACKAGE...: as hack/build-tools.sh, into a folder keyed by the
# module's go.mod, go.sum and Go files (key_files) and the flags.
# shellcheck source=hack/gobuild.sh
source "$here/gobuild.sh"
key_files() {
  (cd "$1" && find . -maxdepth 1 -type f \( -name 'go.mod' -o -name 'go.sum' -o -name '*.go' \) | sort)
}

k8s=$(version_of "$here/k8s" k8s.io/kubernetes)
node_k8s=$(version_of "$here/node" k8s.io/kubernetes)
if [ "$k8s" != "$node_k8s" ]; then
  echo "hack/node/go.mod requires k8s.io/kubernetes $node_k8s, hack/k8s/go.mod $k8s: make them equal" >&2
  exit 1
fi
minor=${k8s#v1.}; minor=${minor%%.*}
v=k8s.io/component-base/version
# The control plane's flags (hack/build-tools.sh): the kubelet reports the same version.
k8s_ldflags="-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor"
k8s_ldflags+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
node_out=$(BUILD_KEY_FILES=$(key_files "$here/node") build "$here/node" "$k8s_ldflags" \
  kubelet=k8s.io/kubernetes/cmd/kubelet kube-proxy=k8s.io/kubernetes/cmd/kube-proxy)

coredns=$(version_of "$here/coredns" github.com/coredns/coredns)
coredns_out=$(BUILD_KEY_FILES=$(key_files "$here/coredns") build "$here/coredns" "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$coredns" \
  coredns=.)

pause_out=$(BUILD_KEY_FILES=$(key_files "$here/pause") build "$here/pause" "-s -w" pause=.)
if [ ! -f "$pause_out/pause.tar" ] || [ "$(cat "$pause_out/pause.ref" 2>/dev/null)" != "$pause_image" ]; then
  ctr=$(buildah from scratch)
  trap 'buildah rm "$ctr" >/dev/null' EXIT
  buildah copy --quiet "$ctr" "$pause_out/pause" /pause
  buildah config --entrypoint '["/pause"]' --user 65535:65535 \
    --label "org.opencontainers.image.description=the local node's pod sandbox (hack/pause)" "$ctr"
  buildah commit --quiet --rm "$ctr" "$pause_image" >/dev/null
  trap - EXIT
  rm -f "$pause_out/pause.tar.partial"
  buildah push --quiet "$pause_image" "docker-archive:$pause_out/pause.tar.partial:$pause_image"
  mv "$pause_out/pause.tar.partial" "$pause_out/pause.tar"
  echo "$pause_image" > "$pause_out/pause.ref"
fi

bin="$cache/bin"
mkdir -p "$bin"
for f in "$node_out/kubelet" "$node_out/kube-proxy" "$coredns_out/coredns" "$pause_out/pause.tar"; do
  ln -sfn "$f" "$bin/$(basename "$f")"
done
echo "$bin"
