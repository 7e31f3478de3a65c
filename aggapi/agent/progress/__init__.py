"""The agent's progress engine: image pull progress read from the container runtime.

One :class:`~aggapi.agent.progress.poller.ProgressPoller` per node polls a backend
(containerd's content store, leases and snapshots; or CRI's phases only) and shares
each observation with every subscriber; :mod:`~aggapi.agent.progress.view` turns it
into the API's objects and :mod:`~aggapi.agent.progress.handlers` serves them.
"""
