// Command pause is the sandbox ("pause") container of the real nodes' pods.
//
// Every pod's first container holds its namespaces and, as PID 1, reaps orphans. No image can
// be pulled here, so the nodes use this one, built with the rest of the cluster and imported
// into each node's containerd. It sleeps until SIGINT or SIGTERM and reaps children on SIGCHLD.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
