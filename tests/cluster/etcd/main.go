// Command etcd is the etcd server of the pinned release, built from the Go module proxy for
// the end-to-end suite (scripts/setup-cluster-tools.sh). It is etcd's own main, unchanged.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
