// Command pause is the local node's pod sandbox process (hack/build-node.sh puts it in an image
// of its own, the sandbox image containerd's config names): it holds the pod's namespaces, sleeps
// until SIGINT or SIGTERM, then exits 0, and as PID 1 of a pod that shares its process namespace
// reaps the orphans re-parented to it, as the upstream pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
