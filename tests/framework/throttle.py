"""A bandwidth-limited TCP proxy (127.0.0.1 unless told), to make pulls slow enough to watch.

The proxy runs its own asyncio loop in a daemon thread, so it serves at a steady
rate whatever the test's loop is doing, and one instance can be shared by tests
that run on different loops. All public methods are thread-safe and blocking
(they return once the proxy's loop has applied them).

It also records when each registry blob's bytes left it (:meth:`ThrottleProxy.blob_log`):
the ground truth that benchmarks/bench_progress_accuracy.py compares reported progress with.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")
CHUNK = 64 * 1024
# A registry blob request: which blob the answer on this connection carries.
BLOB_REQUEST = re.compile(rb"(?:GET|HEAD) /v2/\S+/blobs/(sha256:[0-9a-f]{64})")
# Any request line: a request for something else ends the recording of the last blob.
REQUEST_LINE = re.compile(rb"(?:GET|HEAD|POST|PUT|PATCH|DELETE) /\S* HTTP/1\.[01]\r\n")
HEAD_END = b"\r\n\r\n"
# Bounds of the blob log: samples per fetch (halved when reached), fetches kept in all.
MAX_SAMPLES = 4096
MAX_FETCHES = 1024


@dataclass
class BlobFetch:
    """One GET of one blob through the proxy: when its body bytes left the proxy.

    ``samples`` are (monotonic s, wall-clock s, body bytes sent so far), one per write
    (at most 64 KiB apart) until :data:`MAX_SAMPLES`, then every other one is dropped
    (the first and last are kept). The HTTP response head is not counted."""

    digest: str
    started: float  # wall clock, when the request was seen
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    head: bytearray = field(default_factory=bytearray, repr=False)
    in_body: bool = False

    @property
    def received(self) -> int:
        return self.samples[-1][2] if self.samples else 0

    def add(self, data: bytes) -> None:
        """``data`` was just written to the client: count what of it is body."""
        if not self.in_body:
            self.head += data
            end = self.head.find(HEAD_END)
            if end < 0:
                if len(self.head) > 65536:  # not HTTP: stop looking
                    self.in_body = True
                    self.head.clear()
                return
            body = len(self.head) - end - len(HEAD_END)
            self.head.clear()
            self.in_body = True
        else:
            body = len(data)
        if body <= 0:
            return
        self.samples.append((time.monotonic(), time.time(), self.received + body))
        if len(self.samples) >= MAX_SAMPLES:
            last = self.samples[-1]
            del self.samples[1::2]
            if self.samples[-1] is not last:
                self.samples.append(last)

    def copy(self) -> BlobFetch:
        return BlobFetch(self.digest, self.started, list(self.samples), in_body=self.in_body)


class TokenBucket:
    """Shared by all connections: ``rate`` bytes/s in total, bursts of ``burst``."""

    def __init__(self, rate: float | None, burst: int = CHUNK) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    def set_rate(self, rate: float | None) -> None:
        self._refill()
        self.rate = rate

    def _cap(self) -> float:
        # 50 ms worth of tokens: enough that sleep overshoot is not lost capacity,
        # small enough that progress stays smooth.
        return max(float(self.burst), (self.rate or 0) * 0.05)

    def _refill(self) -> None:
        now = time.monotonic()
        if self.rate:
            self.tokens = min(self._cap(), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    async def take(self, n: int) -> None:
        """Spend ``n`` tokens, going into debt and sleeping it off: the long-run rate is
        exact whatever the sleep granularity. The lock keeps waiters fair (FIFO)."""
        async with self.lock:
            if not self.rate:
                return
            self._refill()
            self.tokens -= n
            while self.rate and self.tokens < 0:
                await asyncio.sleep(min(-self.tokens / self.rate, 0.1))
                self._refill()


class ThrottleProxy:
    """Forward ``bind``:<port> to ``upstream`` (host:port), limiting the download
    direction (upstream -> client) to ``rate`` bytes/s (None: unlimited)."""

    def __init__(self, upstream: str, rate: float | None = None, *, port: int = 0,
                 bind: str = "127.0.0.1") -> None:
        host, _, p = upstream.removeprefix("http://").rpartition(":")
        self.upstream = (host, int(p))
        self.port = port
        self.bind = bind
        self.bytes_down = 0
        self._rate = rate
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._bucket: TokenBucket | None = None
        self._flowing: asyncio.Event | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._blob_buckets: dict[str, TokenBucket] = {}
        self._fetches: list[BlobFetch] = []  # every blob GET, in the order seen

    @property
    def host(self) -> str:
        """``<bind>:PORT``: use it as the registry host in image references."""
        return f"{self.bind}:{self.port}"

    # --- control (any thread) --------------------------------------------------------

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="throttle-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        self._run(self._setup())

    def stop(self) -> None:
        if self._loop is None:
            return
        self._run(self._kill())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None

    def set_rate(self, rate: float | None) -> None:
        """Change the limit at run time (bytes/s; None: unlimited)."""
        self._rate = rate

        async def apply() -> None:
            assert self._bucket is not None
            self._bucket.set_rate(rate)

        self._run(apply())

    def set_blob_rates(self, rates: dict[str, float | None]) -> None:
        """Give blobs (by digest) their own limits, each independent of the shared one:
        an answer carrying such a blob is paced by that blob's bucket alone. Parallel
        layer downloads then move at different, known rates. Empty: all shared again."""
        async def apply() -> None:
            self._blob_buckets = {d: TokenBucket(r) for d, r in rates.items()}

        self._run(apply())

    def blob_log(self, digest: str | None = None) -> dict[str, list[BlobFetch]]:
        """Per blob digest (or only ``digest``), each GET of it in order (a retried or
        repeated download is a separate :class:`BlobFetch`): copies, safe to keep."""
        async def read() -> dict[str, list[BlobFetch]]:
            out: dict[str, list[BlobFetch]] = {}
            for f in self._fetches:
                if digest is None or f.digest == digest:
                    out.setdefault(f.digest, []).append(f.copy())
            return out

        return self._run(read())

    def clear_blob_log(self) -> None:
        async def clear() -> None:
            self._fetches = []

        self._run(clear())

    def pause(self) -> None:
        """Stall every connection: bytes stop flowing but sockets stay open."""
        self._run(self._set_flow(False))

    def resume(self) -> None:
        self._run(self._set_flow(True))

    def kill(self) -> None:
        """Registry goes down: reset open connections and refuse new ones."""
        self._run(self._kill())

    def revive(self) -> None:
        """Registry is back: accept connections again on the same port."""
        self._run(self._listen())

    # --- loop side -------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None, "ThrottleProxy not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _setup(self) -> None:
        self._bucket = TokenBucket(self._rate)
        self._flowing = asyncio.Event()
        self._flowing.set()
        await self._listen()

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.bind, self.port)
            self.port = self._server.sockets[0].getsockname()[1]

    async def _set_flow(self, on: bool) -> None:
        assert self._flowing is not None
        if on:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _kill(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        uw: asyncio.StreamWriter | None = None
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
            # The bucket pacing this connection's answers: per blob if one is set; and
            # the blob GET the answer carries, if any (recorded in the blob log).
            current: list[TokenBucket | None] = [None]
            fetch: list[BlobFetch | None] = [None]
            up = asyncio.ensure_future(self._pump(cr, uw, throttle=False, current=current,
                                                  fetch=fetch))
            down = asyncio.ensure_future(self._pump(ur, cw, throttle=True, current=current,
                                                    fetch=fetch))
            try:
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
                # Client finished sending: keep relaying the answer until upstream closes.
                if up.done() and not down.done():
                    await down
            finally:
                up.cancel()
                down.cancel()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            for w in (cw, uw):
                if w is not None:
                    # abort(), not close(): a killed registry resets, it doesn't say goodbye.
                    w.transport.abort()

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, *,
                    throttle: bool, current: list[TokenBucket | None],
                    fetch: list[BlobFetch | None]) -> None:
        assert self._bucket is not None and self._flowing is not None
        while True:
            bucket = current[0] or self._bucket
            data = await r.read(CHUNK if not throttle else min(CHUNK, self._chunk(bucket)))
            if not data:
                if w.can_write_eof():
                    w.write_eof()
                return
            if not throttle:
                # Requests on a connection are sequential (no pipelining from Go's client).
                m = BLOB_REQUEST.search(data)
                if m is not None:
                    current[0] = self._blob_buckets.get(m.group(1).decode())
                    fetch[0] = (self._record(m.group(1).decode())
                                if m.group(0).startswith(b"GET") else None)
                elif REQUEST_LINE.search(data) is not None:
                    fetch[0] = None
            # The GET this answer belongs to, taken before any wait: the client may send
            # its next request as soon as this answer's last bytes reach it.
            rec = fetch[0] if throttle else None
            await self._flowing.wait()
            if throttle:
                # Looked up again: a new request may have been sent while we read.
                await (current[0] or self._bucket).take(len(data))
                self.bytes_down += len(data)
            w.write(data)
            await w.drain()
            if rec is not None:
                # After drain: the bytes are in the kernel's hands, on their way out.
                rec.add(data)

    def _record(self, digest: str) -> BlobFetch:
        f = BlobFetch(digest, time.time())
        self._fetches.append(f)
        if len(self._fetches) > MAX_FETCHES:
            del self._fetches[: len(self._fetches) - MAX_FETCHES]
        return f

    def _chunk(self, bucket: TokenBucket | None) -> int:
        # ~20 slices per second at the current rate: smooth progress, not bursts.
        rate = bucket.rate if bucket else None
        return max(4096, int(rate / 20)) if rate else CHUNK

    def __enter__(self) -> ThrottleProxy:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
