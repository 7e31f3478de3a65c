//go:build tools

// Package tools pins k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet for hack/build-binaries.sh.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
import _ "k8s.io/kubernetes/cmd/kubelet"
