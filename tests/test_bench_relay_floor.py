"""benchmarks/relay_floor.py end to end at a small size: three real processes over
127.0.0.1, every byte through the relay (a short count raises), both relay kinds; and
the bare agent, its sha256 checked against the file's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.relay_floor import MiB, agent, relay


@pytest.mark.parametrize("mode", ["uvloop", "blocking"])
def test_relay_moves_every_byte(mode: str) -> None:
    pytest.importorskip("uvloop")
    # An odd size and a chunk that does not divide it: the last piece is short.
    out = relay(mode, 3 * MiB + 12345, 256 * 1024)
    assert set(out) == {"relay", "receiver", "sender", "MiB_per_s"}
    assert out["relay"] > 0 and out["receiver"] > 0 and out["MiB_per_s"] > 0


@pytest.mark.parametrize("mode", ["uvloop", "blocking"])
def test_agent_sends_the_file_it_hashed(mode: str, tmp_path: Path) -> None:
    pytest.importorskip("uvloop")
    # agent() raises unless the receiver got every byte and the sha256 the agent
    # computed while sending equals the file's.
    out = agent(mode, 2 * MiB + 999, 256 * 1024, tmp_path)
    assert out["agent"] > 0 and out["receiver"] > 0
