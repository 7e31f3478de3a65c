//go:build tools

// Package tools pins github.com/norwoodj/helm-docs/cmd/helm-docs for hack/build-binaries.sh.
package tools

import _ "github.com/norwoodj/helm-docs/cmd/helm-docs"
