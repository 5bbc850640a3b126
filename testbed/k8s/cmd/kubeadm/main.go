// SPDX-License-Identifier: Apache-2.0

// Command kubeadm is upstream's kubeadm, built from the published k8s.io/kubernetes module:
// the tests ask it for the `kube-proxy` ConfigMap it writes
// (`kubeadm init phase addon kube-proxy --print-manifest`), so that the agent is started
// from kubeadm's own configuration rather than a copy of it.
package main

import (
	"k8s.io/kubernetes/cmd/kubeadm/app"
	"k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() {
	errors.HandleError(app.Run())
}
