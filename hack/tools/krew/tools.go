//go:build tools

// Package tools pins sigs.k8s.io/krew/cmd/krew for hack/build-binaries.sh.
package tools

import _ "sigs.k8s.io/krew/cmd/krew"
