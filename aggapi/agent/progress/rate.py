"""Transfer rates from successive byte counts over a sliding window."""

from __future__ import annotations

from collections import deque


class RateWindow:
    """Bytes per second over the last ``window`` seconds of (time, bytes) samples.

    A sliding window rather than an EWMA so the figure is a plain measurement
    (bytes moved / seconds elapsed) that a test can check against a known rate.
    """

    def __init__(self, window: float = 3.0, min_span: float = 0.5) -> None:
        self.window = window
        self.min_span = min_span
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, value: int) -> None:
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()  # a restarted transfer: old samples say nothing
        self._samples.append((t, value))
        # Keep one sample at or before the window start so the span covers it.
        while len(self._samples) > 2 and self._samples[1][0] <= t - self.window:
            self._samples.popleft()

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, v0), (t1, v1) = self._samples[0], self._samples[-1]
        if t1 - t0 < self.min_span:
            return None
        return round((v1 - v0) / (t1 - t0), 1)


class RateBook:
    """RateWindows by key; windows not updated in a poll are dropped (bounded)."""

    def __init__(self, window: float = 3.0) -> None:
        self.window = window
        self._windows: dict[str, RateWindow] = {}
        self._touched: set[str] = set()

    def add(self, key: str, t: float, value: int) -> float | None:
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = RateWindow(self.window)
        w.add(t, value)
        self._touched.add(key)
        return w.rate()

    def sweep(self) -> None:
        """Call once per poll, after all add()s."""
        for key in self._windows.keys() - self._touched:
            del self._windows[key]
        self._touched.clear()

    def __len__(self) -> int:
        return len(self._windows)
