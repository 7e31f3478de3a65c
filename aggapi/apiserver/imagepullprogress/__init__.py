"""pods/imagepullprogress and nodes/imagepulls (KEP-5334): the feature, one module per concern.

The agent reports what the runtime shows (bytes per layer); Kubernetes reports
what kubelet decided (scheduled yet, pull started, pull failed with the registry's
text, back-off). The feature merges the two into one stream:

- unscheduled pod: ``Unscheduled`` objects until it has a node;
- kubelet has not asked for an image yet (e.g. behind an init container):
  ``Pending``; it asked and the runtime shows nothing: ``Pulling``, or ``Waiting``
  when the node is at its pull limit (KEP-3673), with the node's pull slots and
  its in-flight pulls (other pods' as a count, unless the caller may get
  nodes/imagepulls);
- kubelet failed or backs off: ``Failed``/``BackOff`` with the error; when
  following, the stream goes on to kubelet's next attempt (``attempt``), and only
  a failure kubelet never retries ends it with a ``kind: Error``;
- every image present: the agent's ``kind: Summary`` ends the stream; a
  ``follow=false`` snapshot ends with a Summary of its own (``complete: false``).

On the plain path (verb get) kube-apiserver cuts the request at 60 s, possibly
mid-line, so the stream ends itself before ``--stream-deadline`` with a
``kind: Timeout`` object naming the long-running ``/watch/`` path to resume on.

Modules: ``handler`` (the thin HTTP side of pods/imagepullprogress), ``producer``
(the shared per-stream state machine), ``merge`` (the merge policy of the agent's
and Kubernetes' views), ``nodeview`` (nodes/imagepulls and the node's pull slots),
``objects`` (the stream's object shapes), and their helpers ``pullstate``,
``podwatch``, ``fanout`` and ``streaming``.
"""
