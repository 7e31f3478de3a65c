//go:build tools

// Package tools pins github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr for hack/build-binaries.sh.
package tools

import _ "github.com/containerd/containerd/v2/cmd/containerd"
import _ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
import _ "github.com/containerd/containerd/v2/cmd/ctr"
