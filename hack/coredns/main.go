// Command coredns is CoreDNS with the plugins the local node's cluster DNS uses (hack/build-node.sh,
// hack/node/Corefile): the kubernetes plugin for Service and Pod names (a gang's <pod>.<run>
// names), bind (the bridge's address only), and the plugins of kubeadm's default Corefile that
// need no upstream (no forward: nothing outside resolves here).
// CoreDNS orders plugins by its own directive list, whatever the import order.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
