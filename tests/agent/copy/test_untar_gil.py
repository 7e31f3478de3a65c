"""A tar flood parsing in a worker must not hold the GIL for long: the event loop
comes back from each socket call needing the GIL, and other tenants' copies wait on
it (issue 24 finding 5; the isolation suite's small downloads slowed by tens of ms)."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.tarextract import TarExtractor
from aggapi.agent.copy.targetdir import open_target_dir
from aggapi.agent.copy.untar import ENTRIES_PER_YIELD, TarSink, yield_gil
from aggapi.agent.copy.uploadparams import UploadParams
from tests import tarcraft as tc

DOT = tc.entry(b"./", typeflag=b"5")  # the entry flood's entry: no file-system work


@pytest.fixture
def make_sink(tmp_path: Path) -> Iterator[Callable[..., TarSink]]:
    (tmp_path / "root" / "dst").mkdir(parents=True)
    root = FsRoot(os.open(tmp_path / "root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                  container_id="gil")
    # No entry limit: the GIL test parses until it has measured.
    limits = CopyLimits(state_dir=str(tmp_path / "state"), max_entries=1 << 40)
    fds: list[int] = [root.root_fd]

    def make(**kw: Any) -> TarSink:
        record = InflightRecord(limits.state_dir, root)
        fd, _ = open_target_dir(root, "/dst", record)
        fds.append(fd)
        ex = TarExtractor(root, record, fd, "/dst", UploadParams())
        return TarSink(ex, root, limits, **kw)

    yield make
    for fd in fds:
        os.close(fd)


# A fresh sink per example; the fixture only provides the root.
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.integers(0, 3000), piece=st.sampled_from([512, 4096, 65536]))
def test_sink_pauses_once_per_slice_of_entries(make_sink: Callable[..., TarSink], entries: int,
                                               piece: int) -> None:
    pauses = 0

    def pause() -> None:
        nonlocal pauses
        pauses += 1

    sink = make_sink(pause=pause)
    raw = DOT * entries
    sink.feed_many([raw[i:i + piece] for i in range(0, len(raw), piece)])
    assert sink.entries == entries
    assert pauses == entries // ENTRIES_PER_YIELD


def test_flood_parse_lets_another_thread_have_the_gil(make_sink: Callable[..., TarSink]) -> None:
    """With a 50 ms switch interval, a thread back from a system call waits up to 50 ms
    for the GIL while a parse holds it; the sink's pauses cut that to one slice. The
    median, as the machine may be busy: before the pauses it was the whole 50 ms."""
    sink = make_sink(pause=yield_gil)
    # Pieces under 2 KiB: hashlib releases the GIL only for bigger updates.
    batch = [DOT * 2] * 4096  # 8,192 entries, 4 MiB
    waits: list[float] = []
    parsing = threading.Event()
    done = threading.Event()

    def parse() -> None:
        parsing.set()
        while not done.is_set():
            sink.feed_many(batch)

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    t = threading.Thread(target=parse, daemon=True)
    try:
        t.start()
        parsing.wait()
        for _ in range(40):
            # Like the event loop in epoll: the GIL is released for a ms, and the
            # parse takes it; then the GIL is needed back.
            t0 = time.perf_counter()
            time.sleep(0.001)
            waits.append(time.perf_counter() - t0 - 0.001)
        assert t.is_alive()  # parsed all along
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(old)
    assert statistics.median(waits) < 0.010, sorted(waits)
