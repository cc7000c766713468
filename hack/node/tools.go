//go:build tools

// Package tools pins the node commands this module builds (hack/build-node.sh): the kubelet and
// kube-proxy of the very Kubernetes release hack/k8s builds the control plane from.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
