"""pods/imagepullprogress and nodes/imagepulls (KEP-5334): the feature, one module per concern.

The agent reports what the runtime shows (bytes per layer); Kubernetes reports
what kubelet decided (scheduled yet, pull started, pull failed with the registry's
text, back-off). The feature merges the two into one stream:

- unscheduled pod: ``Unscheduled`` objects until it has a node;
- kubelet failed or backs off: the object carries the error, then a final
  ``kind: Error`` ends the stream (so ``kubectl get --raw`` exits);
- kubelet said ``Pulling`` but the runtime shows nothing while the node is at its
  pull limit (KEP-3673): ``Waiting`` with the node's in-flight pulls and the limit;
- every image present: the agent's ``kind: Summary`` ends the stream.

On the plain path (verb get) kube-apiserver cuts the request at 60 s, possibly
mid-line, so the stream ends itself before ``--stream-deadline`` with a
``kind: Timeout`` object naming the long-running ``/watch/`` path to resume on.

Modules: ``handler`` (the thin HTTP side of pods/imagepullprogress), ``producer``
(the shared per-stream state machine), ``merge`` (the merge policy of the agent's
and Kubernetes' views), ``nodeview`` (nodes/imagepulls and the node's pull slots),
``objects`` (the stream's object shapes), and their helpers ``pullstate``,
``podwatch``, ``fanout`` and ``streaming``.
"""
