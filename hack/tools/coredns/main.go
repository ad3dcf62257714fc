// Command coredns is CoreDNS with only the plugins the real node's cluster
// DNS needs (make dev NODE=real, make test-real-node): the full build pulls
// every cloud provider's SDK. The kubernetes plugin answers for Services and
// for the per-pod names of headless Services, which the bundled etcd's
// members advertise. There is no forward plugin: pods on the real node have
// no route out, so there is nothing to forward to.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

// The order plugins run in, as CoreDNS's plugin.cfg would set it.
var directives = []string{"bind", "errors", "log", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
