//go:build tools

// Package tools pins helm.sh/helm/v3/cmd/helm for hack/build-binaries.sh.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
