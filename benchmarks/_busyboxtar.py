"""The bench pod's image: busybox with tar and sha256sum on PATH (kubectl cp needs
tar), pushed to a node's registry."""

from __future__ import annotations

from tests.framework import oci
from tests.framework.node import OCI_CACHE, Node

IMAGE_REPO = "aggapi-test/busybox-tar"


def push_tar_image(node: Node) -> str:
    cache = oci.BlobCache(OCI_CACHE)
    links = [oci.TarEntry(f"bin/{a}", kind="symlink", target="busybox")
             for a in ("tar", "sha256sum", "ls", "cat", "rm", "mkdir")]
    img = oci.build_image([cache.busybox_layer(), cache.files_layer(links)],
                          cmd=["/bin/busybox", "sleep", "3600"],
                          labels={"io.aggapi.test": IMAGE_REPO})
    oci.push_image(node.info.registry_host, IMAGE_REPO, img, "1")
    return f"{node.info.registry_host}/{IMAGE_REPO}:1"
