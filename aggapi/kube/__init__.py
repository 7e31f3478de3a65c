"""Talking to kube-apiserver: the REST client, the informer, kubeconfig loading, and
which Events are kubelet's. Empty on purpose: the plugins import only ``kubeconfig``."""
