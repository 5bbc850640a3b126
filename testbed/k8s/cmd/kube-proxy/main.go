// SPDX-License-Identifier: Apache-2.0

// Command kube-proxy is upstream's kube-proxy, built from the published k8s.io/kubernetes
// module: the judge of the scenarios and the peer of the benchmarks.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
