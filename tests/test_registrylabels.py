"""Registry hosts as label values: one rule for the agents' pull metrics and the
apiserver's fleet view (aggapi.registrylabels)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aggapi.registrylabels import (
    MAX_REGISTRIES,
    OTHER,
    UNKNOWN,
    RegistryLabels,
    host_of_image,
    host_of_repository,
)


def test_an_image_and_its_pulls_repository_name_one_host() -> None:
    # The agent reads containerd's distribution-source form (host, no port); the
    # apiserver reads the pod's image: both give the same label value.
    assert host_of_image("10.251.0.1:5001/aggapi-test/big:prom-1") == "10.251.0.1"
    assert host_of_repository("10.251.0.1/aggapi-test/big") == "10.251.0.1"
    assert host_of_image("busybox") == host_of_repository("docker.io/library/busybox")
    assert host_of_image("Reg.Example/a/b@sha256:" + "a" * 64) == "reg.example"
    assert host_of_image("[fd00::1]:5000/a/b:1") == "[fd00::1]"
    assert host_of_image("not a ref") == UNKNOWN
    assert host_of_repository("") == UNKNOWN
    assert host_of_repository("r.example:5000/a") == "r.example"


@given(st.lists(st.from_regex(r"[a-z]{1,8}\.example", fullmatch=True), max_size=80))
def test_labels_are_bounded_and_stable(hosts: list[str]) -> None:
    labels = RegistryLabels()
    first = [labels(h) for h in hosts]
    again = [labels(h) for h in hosts]
    assert first == again  # a host keeps its value
    assert len(set(first) - {OTHER}) <= MAX_REGISTRIES
    kept = list(dict.fromkeys(hosts))[:MAX_REGISTRIES]
    assert all(v == (h if h in kept else OTHER) for h, v in zip(hosts, first, strict=True))
