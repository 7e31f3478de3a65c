"""aggapi: pods/imagepullprogress and pods/copy as a Kubernetes aggregated API."""

GROUP = "subresources.aggapi.io"
VERSION = "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"

__version__ = "0.1.0"
