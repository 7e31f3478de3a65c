"""Build OCI images without docker and push them to a registry over plain HTTP.

Layers are gzip'd tars (compresslevel 1) written to files in a cache directory
while their digests are computed, so a 150 MB layer is built once per session
and never held in memory. Manifests, configs and indexes are small JSON kept in
memory. Everything here is blocking; async callers use the ``a*`` wrappers,
which run it in a thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# The types are ocitypes.py's, the layers ocilayers.py's, pushing ocipush.py's; this module
# builds images from layers, and its users reach all of it as ``oci.<name>``.
from tests.framework.ocilayers import BlobCache
from tests.framework.ocipush import (  # noqa: F401
    PushedImage,
    apush_image,
    apush_index,
    push_blob,
    push_image,
    push_index,
    push_manifest,
)
from tests.framework.ocitypes import (  # noqa: F401
    BUSYBOX,
    CHUNK,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER,
    MEDIA_MANIFEST,
    Blob,
    Image,
    Index,
    Layer,
    TarEntry,
)


def build_image(layers: Sequence[Layer], *, os_: str = "linux", arch: str = "amd64",
                entrypoint: Sequence[str] | None = None, cmd: Sequence[str] | None = None,
                env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                      "/usr/bin:/sbin:/bin",),
                labels: Mapping[str, str] | None = None, workdir: str = "/") -> Image:
    """Config + manifest for ``layers``. ``labels`` make otherwise-equal images distinct."""
    cfg: dict[str, object] = {"Env": list(env), "WorkingDir": workdir,
                              "Labels": dict(labels or {})}
    if entrypoint is not None:
        cfg["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        cfg["Cmd"] = list(cmd)
    config = Blob.of_json({
        "created": "2024-01-01T00:00:00Z",
        "architecture": arch,
        "os": os_,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [la.diff_id for la in layers]},
        "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "tests.framework.oci"}
                    for _ in layers],
    }, MEDIA_CONFIG)
    manifest = Blob.of_json({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config.descriptor(),
        "layers": [la.blob.descriptor() for la in layers],
    }, MEDIA_MANIFEST)
    return Image(manifest, config, tuple(layers), os_, arch)


def build_index(images: Sequence[Image]) -> Index:
    """A multi-platform image index over per-platform manifests."""
    index = Blob.of_json({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            img.manifest.descriptor(platform={"architecture": img.architecture, "os": img.os})
            for img in images
        ],
    }, MEDIA_INDEX)
    return Index(index, tuple(images))


def busybox_image(cache: BlobCache, cmd: Sequence[str] = ("/bin/busybox", "sleep", "3600"),
                  labels: Mapping[str, str] | None = None) -> Image:
    """Small runnable image: busybox-static as /bin/busybox (+ sh, sleep links)."""
    return build_image([cache.busybox_layer()], cmd=cmd, labels=labels)


def pause_image(cache: BlobCache) -> Image:
    """Stand-in for registry.k8s.io/pause: sleeps forever as the sandbox's PID 1."""
    return build_image([cache.busybox_layer()],
                       entrypoint=["/bin/busybox", "sleep", "2147483647"],
                       labels={"io.aggapi.test": "pause"})


def no_shell_image(cache: BlobCache) -> Image:
    """A single static binary, no /bin/sh and no tar: what `kubectl cp` can't handle.

    busybox is stored as /app; the entrypoint runs it through a /sleep symlink
    because busybox picks its applet from argv[0].
    """
    layer = cache.files_layer([
        TarEntry("app", src=BUSYBOX, mode=0o755),
        TarEntry("sleep", kind="symlink", target="app"),
        TarEntry("data", kind="dir", mode=0o777),
        TarEntry("tmp", kind="dir", mode=0o1777),
    ])
    return build_image([layer], entrypoint=["/sleep", "3600"], env=(),
                       labels={"io.aggapi.test": "no-shell"})
