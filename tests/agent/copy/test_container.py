"""CRIResolver against a fake CRI client: 404, 409, VM refusal, and a live pid."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from aggapi.agent.copy.container import CRIResolver
from aggapi.agent.copy.workers import Workers
from aggapi.status import StatusError
from tests.agent.copy.conftest import Box


@dataclass
class SB:
    id: str
    runtime_handler: str = "runc"


@dataclass
class Ctr:
    id: str


@dataclass
class Status:
    id: str
    state: str
    pid: int | None
    name: str = "c"
    runtime_type: str | None = "io.containerd.runc.v2"


class FakeCRI:
    def __init__(self, sandboxes: list[SB], statuses: dict[str, Status]) -> None:
        self.sandboxes = sandboxes
        self.statuses = statuses

    async def list_pod_sandboxes(self, labels: dict[str, str]) -> list[SB]:
        return self.sandboxes

    async def list_containers(self, sandbox_id: str, labels: dict[str, str]) -> list[Ctr]:
        return [Ctr(i) for i in self.statuses]

    async def container_status(self, cid: str, verbose: bool = False) -> Status | None:
        return self.statuses.get(cid)


async def resolve(cri: Any) -> Any:
    workers = Workers(1)
    try:
        return await CRIResolver(cri, workers).resolve("uid", "c")
    finally:
        workers.shutdown()


@pytest.mark.parametrize(("cri", "code"), [
    (FakeCRI([], {}), 404),
    (FakeCRI([SB("s")], {}), 404),
    (FakeCRI([SB("s")], {"a": Status("a", "CONTAINER_EXITED", None)}), 409),
    (FakeCRI([SB("s", "kata")], {"a": Status("a", "CONTAINER_RUNNING", 1)}), 501),
    (FakeCRI([SB("s")], {"a": Status("a", "CONTAINER_RUNNING", 1, runtime_type="io.containerd"
                                                                              ".kata.v2")}), 501),
    (FakeCRI([SB("s")], {"a": Status("a", "CONTAINER_RUNNING", 2**22 + 12345)}), 409),
])
async def test_refusals(cri: FakeCRI, code: int) -> None:
    with pytest.raises(StatusError) as err:
        await resolve(cri)
    assert err.value.code == code


async def test_running_container_opens_its_root(box: Box) -> None:
    cri = FakeCRI([SB("s")], {"a": Status("a", "CONTAINER_RUNNING", box.pid)})
    root = await resolve(cri)
    try:
        assert root.alive() and root.pid == box.pid
        assert os.stat("etc/passwd", dir_fd=root.root_fd).st_ino == \
            (box.rootfs / "etc" / "passwd").stat().st_ino
    finally:
        root.close()
