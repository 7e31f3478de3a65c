//go:build tools

// Package tools pins github.com/anchore/syft/cmd/syft for hack/build-binaries.sh.
package tools

import _ "github.com/anchore/syft/cmd/syft"
