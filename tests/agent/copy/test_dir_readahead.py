"""A directory download builds its tar one walk step ahead (issue 35): while one MiB of
the tar is written to the client, the next is already being walked in a worker, as a
file's range is read one chunk ahead; and nothing leaks or runs on when it stops."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggapi.agent.copy import send, tarwalk
from aggapi.client.extract import extract_dir
from aggapi.tar.stream import TarReader
from tests.filetrees import read_tree, write_tree

MiB = 1 << 20
TRAILER = {"digest": "trailer"}


class Steps:
    """Wraps TarWalker.chunks: counts the steps the walk has finished (in its worker)."""

    def __init__(self) -> None:
        self.done = 0
        self.second = threading.Event()  # the step after the first has finished

    def wrap(self, chunks: Any) -> Any:
        steps = self

        def counted(walker: tarwalk.TarWalker) -> Generator[bytes, None, None]:
            for chunk in chunks(walker):
                steps.done += 1
                if steps.done >= 2:
                    steps.second.set()
                yield chunk
        return counted


async def test_the_next_step_is_walked_while_a_chunk_is_written(
        cc: Any, plain: tuple[Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tree = {f"d/f{i}": os.urandom(MiB + i) for i in range(4)}
    write_tree(plain[0] / "t", tree)
    steps = Steps()
    monkeypatch.setattr(tarwalk.TarWalker, "chunks", steps.wrap(tarwalk.TarWalker.chunks))
    overlapped: list[bool] = []
    real_write = send.write

    async def held_write(request: web.Request, resp: web.StreamResponse,
                         chunk: bytes) -> None:
        if not overlapped:  # the first chunk: is the second walked before it is out?
            overlapped.append(await asyncio.to_thread(steps.second.wait, 5.0))
        await real_write(request, resp, chunk)

    monkeypatch.setattr(send, "write", held_write)
    r = await cc.get("/t", query=TRAILER)
    raw = await r.read()
    assert r.status == 200 and overlapped == [True]
    sr = asyncio.StreamReader()
    sr.feed_data(raw)
    sr.feed_eof()
    res = await extract_dir(TarReader(sr), tmp_path / "dst")
    assert res.verified and read_tree(tmp_path / "dst") == tree


async def test_a_walk_that_fails_ahead_cuts_the_body_after_what_was_built(
        cc: Any, plain: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The step ahead fails (an OSError in the walk): the chunk before it still goes
    out, then the connection is cut, never a clean end; the generator is closed."""
    write_tree(plain[0] / "t", {f"f{i}": os.urandom(MiB) for i in range(3)})
    closed = threading.Event()

    def failing(walker: tarwalk.TarWalker) -> Generator[bytes, None, None]:
        try:
            yield b"x" * MiB
            raise OSError(5, "input/output error")
        finally:
            closed.set()
    monkeypatch.setattr(tarwalk.TarWalker, "chunks", failing)
    r = await cc.get("/t", query=TRAILER)
    got = b""
    with pytest.raises(aiohttp.ClientPayloadError):  # a cut body, not a clean end
        async for piece in r.content.iter_any():
            got += piece
    assert got == b"x" * MiB and closed.is_set()
