//go:build tools

// Package tools pins k8s.io/kubernetes/cmd/kube-apiserver for hack/build-binaries.sh.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
