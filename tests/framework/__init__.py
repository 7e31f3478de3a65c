"""The test harness: real control plane, node, kubelet, containerd, registry and fakes.

Used by the tests, ``hack/local-up.sh`` and the benchmarks, from a source checkout only
(it is not part of the shipped ``aggapi`` package). Run its CLIs from the repository root,
e.g. ``python3 -m tests.framework.controlplane up``.
"""
