// Command coredns is CoreDNS with only the plugins a local cluster's DNS needs.
//
// CoreDNS's own main registers every plugin it ships (cloud DNS providers, etcd, tracing
// exporters) and pulls their SDKs into the build. The real nodes' cluster DNS serves
// cluster.local from the API server and forwards nothing (there is no route off the machine),
// so this main registers that short list; the Corefile that `scripts/cluster up` writes uses it.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
