"""Safe copy into and out of running containers (KEP-4582), the agent side.

One concern per module: :mod:`.handlers` (HTTP, /v1/copy), :mod:`.engine`
(state and lifecycle), :mod:`.container` (CRI -> an open container root),
:mod:`.download` and :mod:`.upload` (+ :mod:`.tarextract`) for the transfers,
:mod:`.fsroot`, :mod:`.openat2`, :mod:`.atomic` and :mod:`.idmap` for the file
system, :mod:`.creds` to act as the container's user, :mod:`.quotas`,
:mod:`.workers` and :mod:`.cleanup` for limits, threads and crash recovery.
Kept empty so that importing one module (say, the quotas from
aggapi.agent.config) does not import them all.
"""
