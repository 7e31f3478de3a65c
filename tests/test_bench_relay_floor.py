"""benchmarks/relay_floor.py end to end at a small size: three real processes over
127.0.0.1, every byte through the relay (a short count raises), both relay kinds."""

from __future__ import annotations

import pytest

from benchmarks.relay_floor import MiB, relay


@pytest.mark.parametrize("mode", ["uvloop", "blocking"])
def test_relay_moves_every_byte(mode: str) -> None:
    pytest.importorskip("uvloop")
    # An odd size and a chunk that does not divide it: the last piece is short.
    out = relay(mode, 3 * MiB + 12345, 256 * 1024)
    assert set(out) == {"relay", "receiver", "sender", "MiB_per_s"}
    assert out["relay"] > 0 and out["receiver"] > 0 and out["MiB_per_s"] > 0
