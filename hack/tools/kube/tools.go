//go:build tools

// Package tools pins k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl for hack/build-binaries.sh.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
import _ "k8s.io/kubernetes/cmd/kubelet"
import _ "k8s.io/kubernetes/cmd/kube-controller-manager"
import _ "k8s.io/kubernetes/cmd/kube-scheduler"
import _ "k8s.io/kubernetes/cmd/kube-proxy"
import _ "k8s.io/kubernetes/cmd/kubectl"
