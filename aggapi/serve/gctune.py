"""The cyclic garbage collector, tuned for a server that holds a cluster's worth of
parsed JSON. py-spy on the real-stack bench (10,000 pods, the leader's warm feed) put
16-27% of the apiserver's samples in ``gc_collect_main``: every collection of the old
generation scanned every pod, event and object again, though JSON trees hold no cycles
(reference counting frees them; the collector finds nothing there).

- ``tune``: a young collection after 50,000 new container objects instead of 700, so
  the old generation's full scans come that much less often (a rollout allocates
  millions);
- ``freeze``: once the leader's cluster-wide feed is built, everything alive then goes
  to the permanent generation and is never scanned again; it is still freed as usual
  when its last reference goes. One full collection first, so no garbage is frozen.
  Later freezes (each term's build, each mirror sync) collect only the young
  generations first: a full collection then scanned a million objects (a mirror and a
  term's build at 50,000 pods), holding a new leader's loop 1.6-2.6 s in its first
  seconds. What cyclic garbage the old generation holds then stays frozen; JSON
  trees, nearly all of it, have no cycles.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

GEN0 = 50_000


def tune() -> None:
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GEN0), gen1, gen2)


def freeze() -> None:
    t0 = time.monotonic()
    gc.collect(2 if gc.get_freeze_count() == 0 else 1)
    gc.freeze()
    log.info("objects built: moved out of the collector's scans",
             extra={"frozen": gc.get_freeze_count(),
                    "seconds": round(time.monotonic() - t0, 3)})
