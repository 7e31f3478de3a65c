"""The collection resources podimagepulls and nodeimagepulls: every followed pod's
(every node's) pulls as list/watch storage, in the spirit of metrics.k8s.io.

Cost follows namespaces and nodes, not pods: ``sources`` holds one pod and one event
informer per namespace in use (or one pair cluster-wide), ``nodepolls`` one poll of
the agent's node view per node of interest; both start on first use and stop after
a linger once idle. ``feeds`` turns them into ``store`` collections (objects,
resourceVersions, watch history) through the same merge policy as the per-pod
subresource (``imagepullprogress.merge``). One module per resource
(``podimagepulls``, ``nodeimagepulls``: object and table columns), ``selectors``,
``table`` and the thin HTTP ``handler``.
"""
