//go:build tools

// Package tools pins github.com/sigstore/cosign/v2/cmd/cosign for hack/build-binaries.sh.
package tools

import _ "github.com/sigstore/cosign/v2/cmd/cosign"
