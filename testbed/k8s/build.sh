#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds upstream's etcd, kube-apiserver, kube-controller-manager, kube-proxy and kubeadm from the
# modules go.mod pins into $OUT (default: <repo>/target/k8s-testbed). Go's own caches
# (GOCACHE, GOMODCACHE) stay in their default places, so a second build relinks at most.
set -euo pipefail
cd "$(dirname "$0")"
OUT="${OUT:-$(cd ../.. && pwd)/target/k8s-testbed}"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"
version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="${version#v1.}"; minor="${minor%%.*}"
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp="$stamp -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    stamp="$stamp -X $pkg.gitTreeState=clean"
done
mkdir -p "$OUT"
go build -p "${GO_BUILD_JOBS:-2}" -ldflags "-s -w$stamp" -o "$OUT/" ./cmd/...
echo "$version" > "$OUT/VERSION"
