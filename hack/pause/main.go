// Command pause is the real node's pod sandbox image: it holds a pod's
// namespaces open until the kubelet stops the pod. Built locally, like every
// image of the real node (no image registry is reachable here), and tagged
// registry.k8s.io/pause:3.10, the sandbox image containerd expects.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 of the sandbox, reap whatever is reparented to it.
	signal.Ignore(syscall.SIGCHLD)
	<-stop
}
