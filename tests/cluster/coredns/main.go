// Command coredns is the cluster DNS of the real-node end-to-end stage (scripts/real-nodes.sh):
// CoreDNS at the version the pinned Kubernetes release ships (build/dependencies.yaml), built
// from the Go module proxy with only the plugins that stage's Corefile uses, so the build does
// not compile every cloud provider's SDK. The main is CoreDNS's own (coremain.Run).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins above, in CoreDNS's own order (plugin.cfg): a Corefile's directives run in this order.
var directives = []string{"bind", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes", "forward"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
