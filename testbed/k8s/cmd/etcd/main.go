// SPDX-License-Identifier: Apache-2.0

// Command etcd is etcd's own command line (etcdmain), at the version k8s.io/kubernetes
// requires, for the kube-apiserver of the tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
