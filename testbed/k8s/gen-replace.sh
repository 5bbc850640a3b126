#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates go.mod's replace block from k8s.io/kubernetes@$K8S's own go.mod: every
# staging module it requires at the placeholder v0.0.0 is replaced by its published
# v0.<minor>.<patch> tag. Then tidies (never `go get -u`: newer kube-openapi and
# structured-merge-diff need a newer Go than this release's).
set -euo pipefail
cd "$(dirname "$0")"
K8S="${K8S:-v1.37.2}"
export GOTOOLCHAIN=local CGO_ENABLED=0
staging_version="v0.${K8S#v1.}"
upstream_mod="$(go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
[ -f "$upstream_mod" ] || { echo "no go.mod for k8s.io/kubernetes@$K8S" >&2; exit 1; }
# Drop replaces of staging modules left from an earlier release, then add this one's.
go mod edit -print | sed -n 's/^\(replace\)\{0,1\}\s*\(k8s\.io\/[a-z0-9-]*\) => .*/\2/p' |
    while read -r old; do go mod edit -dropreplace="$old"; done
grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$upstream_mod" | awk '{print $1}' |
    while read -r name; do
        go mod edit -replace="$name=$name@$staging_version"
    done
go mod edit -require="k8s.io/kubernetes@$K8S"
go mod tidy
