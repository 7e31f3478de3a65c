"""The per-thread credential switch the copy engine acts through (aggapi.agent.copy.creds).

Needs root (CAP_SETUID/CAP_SETGID), as the agent has. Files live in a 0755
directory under /tmp: pytest's own tmp dirs are 0700, which would refuse uid
1000 for the wrong reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import creds
from aggapi.agent.copy.creds import Creds
from aggapi.agent.copy.workers import Workers
from aggapi.status import StatusError

USER = Creds(1000, 1000, ())

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as the agent")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="aggapi-creds-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def make(path: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    path.write_bytes(b"data")
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


def can_read(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.read()
    except PermissionError:
        return False
    return True


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a fresh thread (its credentials die with it); re-raise its error."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_a_user_thread_is_refused_while_another_thread_reads(shared_dir: Path) -> None:
    secret = make(shared_dir / "secret", 0o600)
    public = make(shared_dir / "public", 0o644)
    inside = threading.Event()
    checked = threading.Event()
    seen: dict[str, bool] = {}

    def user() -> None:
        with creds.acting_as(USER):
            seen["secret"] = can_read(secret)
            seen["public"] = can_read(public)
            seen["creds"] = Creds.current() == USER
            inside.set()
            checked.wait()  # hold the user's identity while the main thread reads
        seen["after"] = can_read(secret)
        seen["restored"] = Creds.current() == baseline

    baseline = Creds.current()
    t = threading.Thread(target=user)
    t.start()
    assert inside.wait(30)
    try:
        assert can_read(secret), "the switch leaked to another thread"
        assert Creds.current() == baseline
    finally:
        checked.set()
        t.join()
    assert seen == {"secret": False, "public": True, "creds": True, "after": True,
                    "restored": True}


def test_groups_are_per_thread_and_grant_group_access(shared_dir: Path) -> None:
    f = make(shared_dir / "group-file", 0o640, 0, 2000)
    main_groups = sorted(os.getgroups())
    inside = threading.Event()
    release = threading.Event()
    seen: dict[str, Any] = {}

    def member() -> None:
        with creds.acting_as(Creds(1000, 1000, (2000,))):
            seen["member"] = can_read(f)
            inside.set()
            release.wait()
        with creds.acting_as(Creds(1000, 1000, (3000,))):
            seen["other"] = can_read(f)

    t = threading.Thread(target=member)
    t.start()
    assert inside.wait(30)
    try:
        assert sorted(os.getgroups()) == main_groups, "setgroups changed another thread"
    finally:
        release.set()
        t.join()
    assert seen == {"member": True, "other": False}


def test_user_cannot_chown_and_root_comes_back(shared_dir: Path) -> None:
    home = shared_dir / "home"
    home.mkdir()
    os.chown(home, 1000, 1000)

    def body() -> tuple[int, int, bool]:
        with creds.acting_as(USER):
            fd = os.open(home / "new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                st = os.fstat(fd)
                try:
                    os.fchown(fd, 0, 0)
                    gave_away = True
                except PermissionError:
                    gave_away = False
            finally:
                os.close(fd)
            with creds.as_agent():  # the agent's own identity, inside the scope
                os.chown(home / "new", 0, 0)
        return st.st_uid, st.st_gid, gave_away

    assert in_thread(body) == (1000, 1000, False)
    assert (home / "new").stat().st_uid == 0
    with pytest.raises(PermissionError):
        in_thread(lambda: _write_as(USER, shared_dir / "denied"))


def _write_as(c: Creds, path: Path) -> None:
    with creds.acting_as(c):
        path.write_bytes(b"x")


def test_failed_restore_poisons_the_thread(monkeypatch: pytest.MonkeyPatch,
                                           shared_dir: Path) -> None:
    real = creds.apply
    calls: list[Creds] = []

    def flaky(c: Creds) -> None:
        calls.append(c)
        if len(calls) == 2:  # the restore
            raise OSError(1, "simulated")
        real(c)

    monkeypatch.setattr(creds, "apply", flaky)

    def body() -> tuple[str, str]:
        try:
            with creds.acting_as(USER):
                pass
        except StatusError as exc:
            first = exc.message
        else:
            first = "no error"
        try:
            with creds.acting_as(None):
                pass
        except StatusError as exc:
            return first, exc.message
        return first, "no error"

    first, later = in_thread(body)
    assert "could not restore" in first
    assert "unknown credentials" in later
    assert not creds.poisoned()  # only that thread


async def test_workers_act_as_the_serving_copy(shared_dir: Path) -> None:
    secret = make(shared_dir / "secret", 0o600)
    workers = Workers(2)
    try:
        with creds.serving(USER):
            assert not await workers.run(can_read, secret)
            assert await workers.run(Creds.current) == USER
            fut = workers.submit(can_read, secret)
        assert not await fut  # the identity was taken when the call was submitted
        assert await workers.run(can_read, secret)
        assert (await workers.run(Creds.current)).uid == 0
    finally:
        workers.shutdown()


ids = st.integers(min_value=0, max_value=0xFFFFFFFE)


@settings(max_examples=200, deadline=None)
@given(real=ids, eff=ids, saved=ids, fs=ids, gfs=ids,
       groups=st.lists(ids, max_size=8))
def test_parse_status_takes_fs_ids(real: int, eff: int, saved: int, fs: int, gfs: int,
                                   groups: list[int]) -> None:
    text = (f"Name:\tsh\nUid:\t{real}\t{eff}\t{saved}\t{fs}\n"
            f"Gid:\t{saved}\t{real}\t{eff}\t{gfs}\nGroups:\t{' '.join(map(str, groups))} \n"
            "NStgid:\t1\n")
    assert Creds.parse_status(text) == Creds(fs, gfs, tuple(sorted(set(groups))))


def test_parse_status_refuses_garbage() -> None:
    with pytest.raises(StatusError):
        Creds.parse_status("Name:\tsh\nUid:\t0\t0\n")


def test_of_pid_reads_this_process() -> None:
    me = Creds.of_pid(os.getpid())
    assert (me.uid, me.gid) == (os.getuid(), os.getgid())


def test_a_failed_switch_is_500_and_leaves_the_thread_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = creds.apply

    def half(c: Creds) -> None:
        if c == USER:
            creds._setgroups(c.groups)  # part of the switch happened, then it failed
            raise OSError(1, "simulated")
        real(c)

    monkeypatch.setattr(creds, "apply", half)

    def body() -> tuple[int, bool, bool]:
        before = Creds.current()
        try:
            with creds.acting_as(USER):
                raise AssertionError("the block ran without the switch")
        except StatusError as exc:
            return exc.code, Creds.current() == before, creds.poisoned()
        return 0, False, True

    assert in_thread(body) == (500, True, False)


def test_user_namespaced_ids_are_reported_as_the_container_sees_them() -> None:
    from aggapi.agent.copy.fsroot import FsRoot
    from aggapi.agent.copy.idmap import IdMap

    shifted = IdMap(((0, 100000, 65536),))
    fd = os.open("/", os.O_PATH)
    user = FsRoot(fd, shifted, shifted, creds=Creds(101000, 101000, (101000,)))
    root = FsRoot(fd, shifted, shifted, creds=Creds(100000, 100000))  # userns root: no caps
    agent = FsRoot(fd, shifted, shifted, creds=None)
    try:
        assert user.who() == "uid 1000 gid 1000" and user.default_ids() == (101000, 101000)
        assert user.as_user and root.as_user and not agent.as_user
        assert root.who() == "uid 0 gid 0" and agent.default_ids() == (100000, 100000)
    finally:
        os.close(fd)


def test_hard_links_as_a_user_without_at_empty_path(monkeypatch: pytest.MonkeyPatch,
                                                     shared_dir: Path) -> None:
    """Kernels before 6.10 refuse linkat(AT_EMPTY_PATH) without CAP_DAC_READ_SEARCH
    (ENOENT), which a user thread lacks: link_fd goes through /proc/self/fd."""
    import ctypes
    import errno

    from aggapi.agent.copy import openat2 as o2

    real = o2._linkat
    refused: list[bytes] = []

    def old_kernel(olddirfd: int, old: bytes, newdirfd: int, new: bytes, flags: int) -> int:
        if flags & o2.AT_EMPTY_PATH:
            refused.append(new)
            ctypes.set_errno(errno.ENOENT)
            return -1
        return int(real(olddirfd, old, newdirfd, new, flags))

    monkeypatch.setattr(o2, "_linkat", old_kernel)
    home = shared_dir / "home"
    home.mkdir()
    os.chown(home, 1000, 1000)

    def body() -> None:
        with creds.acting_as(USER):
            fd = os.open(home / "a", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            dfd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
            try:
                o2.link_fd(fd, dfd, "b")
            finally:
                os.close(fd)
                os.close(dfd)

    in_thread(body)
    assert refused == [b"b"]
    assert (home / "a").stat().st_ino == (home / "b").stat().st_ino
    assert (home / "b").stat().st_uid == 1000


def _cap_eff() -> int:
    """This thread's CapEff, as the kernel reports it (not through creds' own capget)."""
    with open("/proc/thread-self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    raise AssertionError("no CapEff line")


def test_acting_as_a_user_clears_every_effective_capability() -> None:
    """Issue 24 finding 6: a non-zero fsuid drops only the file-system capabilities;
    CAP_SYS_RESOURCE (quotas, ext4's reserved blocks) and the rest must go too while
    the thread acts as the user, and come back afterwards."""
    CAP_SETUID = 1 << 7  # not a file-system capability: setfsuid leaves it

    def body() -> tuple[int, int, int, int, int]:
        before = _cap_eff()
        with creds.acting_as(USER):
            as_user = _cap_eff()
            with creds.as_agent():  # the agent's own files (in-flight records)
                as_agent = _cap_eff()
            back_to_user = _cap_eff()
        return before, as_user, as_agent, back_to_user, _cap_eff()

    before, as_user, as_agent, back_to_user, after = in_thread(body)
    assert before & CAP_SETUID
    assert as_user == 0 and back_to_user == 0
    assert as_agent == before and after == before
    assert _cap_eff() == before  # other threads never changed


def test_acting_as_root_keeps_capabilities() -> None:
    def body() -> tuple[int, int]:
        before = _cap_eff()
        with creds.acting_as(Creds(0, 0, ())):
            return before, _cap_eff()

    before, during = in_thread(body)
    assert during == before


def test_a_failed_capability_restore_poisons_the_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = creds.set_effective_caps

    def refuse_raise(mask: int) -> None:
        if mask:
            raise OSError(1, "simulated")
        real(mask)

    def body() -> tuple[str, bool, int]:
        monkeypatch.setattr(creds, "set_effective_caps", refuse_raise)
        try:
            with creds.acting_as(USER):
                pass
        except StatusError as exc:
            return exc.message, creds.poisoned(), _cap_eff()
        return "no error", creds.poisoned(), _cap_eff()

    message, poisoned, caps = in_thread(body)
    assert "could not restore" in message and poisoned and caps == 0
