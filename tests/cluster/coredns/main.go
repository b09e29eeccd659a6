// CoreDNS for the local test cluster (tests/cluster/controlplane.py), with only the plugins its
// Corefile uses. CoreDNS's own main imports every plugin (core/plugin); this one imports the
// handful below and lists only them as directives, in upstream's order
// (core/dnsserver/zdirectives.go), so a cold build compiles the kubernetes plugin and client-go
// and none of the cloud back ends. There is no `forward` plugin: nothing this server does can
// send a query off the machine; `acl` refuses (and `log` records) every name outside the
// cluster's zones.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/acl"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "log", "acl", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
