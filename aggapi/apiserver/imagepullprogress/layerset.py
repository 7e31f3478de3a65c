"""Which layer objects a stream shows for an image: those of the manifest being pulled.

The agent names on each layer object the manifest (or index) it is of. A re-pull of a
tag that moved (kubelet's ``imagePullPolicy: Always``) replaces the image's layers:
the agent first shows the old record's, then the new manifest's. Layers of another
manifest than the latest are dropped; and while kubelet is about to pull an image the
runtime shows only as present (the new manifest not yet fetched), its layers are held
back behind one image-level object, as before any manifest is known: the pull may
bring other layers than the record has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggapi.apiserver.imagepullprogress.objects import PRESENT

Key = tuple[str, str, str, str]  # objects.object_key
Obj = Mapping[str, Any]


def manifest_of(obj: Obj) -> str:
    return str(obj.get("manifest") or "")


def _image_key(obj: Obj) -> tuple[str, str]:
    return (str(obj.get("container") or ""), str(obj.get("image") or ""))


def _layers_of(raw: Mapping[Key, Obj], obj: Obj) -> list[tuple[Key, Obj]]:
    ik = _image_key(obj)
    return [(k, o) for k, o in raw.items()
            if o.get("kind") == "Progress" and o.get("layer") and _image_key(o) == ik]


def replaced(raw: Mapping[Key, Obj], obj: Obj) -> list[Key]:
    """The layers of ``obj``'s image from another manifest than the one ``obj`` names
    (none when it names none: an agent from before manifests were named)."""
    m = manifest_of(obj)
    if not obj.get("layer") or not m:
        return []
    return [k for k, o in _layers_of(raw, obj) if manifest_of(o) != m]


def unpulled(raw: Mapping[Key, Obj], obj: Obj) -> bool:
    """``obj`` is a layer of a manifest whose every layer the runtime shows present:
    nothing of a pull of it is seen (``raw`` holds ``obj``)."""
    m = manifest_of(obj)
    return bool(obj.get("layer")) and all(
        o.get("phase") in PRESENT for _, o in _layers_of(raw, obj) if manifest_of(o) == m)


def siblings(raw: Mapping[Key, Obj], obj: Obj) -> list[Key]:
    """The other layers of ``obj``'s image and manifest."""
    m = manifest_of(obj)
    return [k for k, o in _layers_of(raw, obj) if manifest_of(o) == m and o is not obj]


def placeholder(obj: Obj) -> dict[str, Any]:
    """The image-level object shown while ``obj``'s layers are held back."""
    out = {k: v for k, v in obj.items() if k != "manifest"}
    out.update(layer="", progress=None, total=None, bytesPerSecond=None, etaSeconds=None)
    return out


def image_phase(raw: Mapping[Key, Obj], obj: Obj) -> str | None:
    """The present phase of ``obj``'s image from its layers: Done when any layer of
    its manifest was fetched, AlreadyPresent when every one was there; None if some
    layer is not present."""
    phases = {o.get("phase") for _, o in _layers_of(raw, obj)}
    if not phases or not phases <= set(PRESENT):
        return None
    return "Done" if "Done" in phases else "AlreadyPresent"
