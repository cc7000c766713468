#!/usr/bin/env bash
# Builds the local environment's Go programs from the Go module proxy into a cache folder outside
# the clone, keyed by each wrapper module's go.mod and go.sum, so a warm run returns at once:
#   k8s/  etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (one release)
#   kwok/ kwok, kwokctl
#   helm/ helm (installs the chart in tests, and for users with Docker)
#   kueue/ kueue (the manager, started on demand by tests/kueue.py), with the module's CRDs
#          (crds/) and webhook definitions (webhooks.yaml) beside it, so they always match
# Prints the bin folder that holds all of them (symlinks into the keyed build folders).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod

# version_of MODULE_DIR MODULE_PATH: the version the wrapper's go.mod requires.
version_of() {
  awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$1/go.mod"
}

# build MODULE_DIR LDFLAGS NAME=PACKAGE...: into a folder keyed by go.mod, go.sum and the flags.
# shellcheck source=hack/gobuild.sh
source "$here/gobuild.sh"

k8s=$(version_of "$here/k8s" k8s.io/kubernetes)
minor=${k8s#v1.}; minor=${minor%%.*}
v=k8s.io/component-base/version
# Without these the binaries report v0.0.0 and kwokctl and kubectl treat them as ancient.
k8s_ldflags="-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor"
k8s_ldflags+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
k8s_out=$(build "$here/k8s" "$k8s_ldflags" etcd=./cmd/etcd \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
  kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
  kubectl=k8s.io/kubernetes/cmd/kubectl)

kwok=$(version_of "$here/kwok" sigs.k8s.io/kwok)
kwok_ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok#v}"
kwok_ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${k8s#v}"
kwok_out=$(build "$here/kwok" "$kwok_ldflags" \
  kwok=sigs.k8s.io/kwok/cmd/kwok kwokctl=sigs.k8s.io/kwok/cmd/kwokctl)

# `go mod tidy` writes a lone requirement on one line: `require helm.sh/helm/v4 vX.Y.Z`.
helm=$(awk '$1 == "require" && $2 == "helm.sh/helm/v4" {print $3; exit}' "$here/helm/go.mod")
[ -n "$helm" ] || { echo "hack/helm/go.mod requires no helm.sh/helm/v4 version" >&2; exit 1; }
hv=helm.sh/helm/v4/internal/version
helm_out=$(build "$here/helm" "-s -w -X $hv.version=$helm -X $hv.gitTreeState=clean" \
  helm=helm.sh/helm/v4/cmd/helm)

# A lone requirement again (see helm above).
kueue=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kueue" {print $3; exit}' "$here/kueue/go.mod")
[ -n "$kueue" ] || { echo "hack/kueue/go.mod requires no sigs.k8s.io/kueue version" >&2; exit 1; }
kv=sigs.k8s.io/kueue/pkg/version
kueue_out=$(build "$here/kueue" "-s -w -X $kv.GitVersion=$kueue -X $kv.BuildDate=1970-01-01" \
  kueue=sigs.k8s.io/kueue/cmd/kueue)
# From the very module version built above (go build just downloaded it): its CRDs into crds/
# and its webhook definitions into webhooks.yaml, which tests/kueue.py finds next to the binary
# the bin/ link points at (only the binary is linked).
if [ ! -d "$kueue_out/crds" ] || [ ! -f "$kueue_out/webhooks.yaml" ]; then
  kueue_src=$(cd "$here/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  rm -rf "$kueue_out/crds.partial"
  mkdir -p "$kueue_out/crds.partial"
  cp "$kueue_src"/config/components/crd/bases/*.yaml "$kueue_out/crds.partial/"
  cp "$kueue_src/config/components/webhook/manifests.yaml" "$kueue_out/webhooks.yaml.partial"
  chmod u+w "$kueue_out"/crds.partial/*.yaml "$kueue_out/webhooks.yaml.partial"  # cache is r/o
  rm -rf "$kueue_out/crds"
  mv "$kueue_out/crds.partial" "$kueue_out/crds"
  mv "$kueue_out/webhooks.yaml.partial" "$kueue_out/webhooks.yaml"
fi

bin="$cache/bin"
mkdir -p "$bin"
for f in "$k8s_out"/* "$kwok_out"/* "$helm_out"/* "$kueue_out/kueue"; do
  ln -sfn "$f" "$bin/$(basename "$f")"
done
echo "$bin"
