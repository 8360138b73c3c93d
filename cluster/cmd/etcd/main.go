// Command etcd runs the etcd server from the pinned go.etcd.io/etcd/server/v3 module.
//
// etcd's own main package lives in its root module, which pulls in etcdctl and etcdutl as
// well; the server's entry point is all the control plane needs.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
