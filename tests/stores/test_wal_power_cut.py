"""Power cuts, alone and after a kill -9 and a restart: the WAL opens with every acknowledged job.

A small durability model stands in for the disk: a power cut keeps each file
as it was at its last ``fsync``/``fdatasync`` (nothing, if never synced), and
each directory with the entries it had at its last directory sync. A ``kill
-9`` keeps the page cache: a copy of the directory as it is, its durable state
carried over. With ``fsync="always"`` and ``"interval"``, every log a run can
leave that way must open; with ``"always"``, every job ``add`` returned must be
in it.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

import trioq
from trioq._app.walcli import verify_command
from trioq.stores import NewJob, StoreConfig


class Disk:
    """What a power cut would keep of the files under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)
        self.durable: dict[str, bytes] = {}  # file -> its bytes at its last sync
        self.entries: dict[str, set[str]] = {}  # directory -> its names at its last sync
        #: Called with the path about to be synced, before the sync (a crash point).
        self.before_sync: Callable[[str], None] | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("fsync", "fdatasync"):
            real = getattr(os, name)

            def synced(fd: int, _real: Callable[[int], None] = real) -> None:
                path = os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))
                if self.before_sync is not None and path.startswith(self.root):
                    self.before_sync(path)
                _real(fd)
                if os.path.isdir(path):
                    self.entries[path] = set(os.listdir(path))
                else:
                    self.durable[path] = Path(path).read_bytes()

            monkeypatch.setattr(os, name, synced)

    def kill_copy(self, source: Path, target: Path) -> None:
        """A kill -9 now: ``target`` holds what ``source`` holds, and as much of it is durable."""
        src, dst = os.path.realpath(source), os.path.realpath(target)
        shutil.copytree(src, dst)
        for path, data in list(self.durable.items()):
            if os.path.dirname(path) == src:
                self.durable[os.path.join(dst, os.path.basename(path))] = data
        if src in self.entries:
            self.entries[dst] = set(self.entries[src])

    def power_cut(self, directory: Path) -> None:
        """Leave in ``directory`` only the segments, and the bytes of them, that were synced."""
        where = os.path.realpath(directory)
        for name in os.listdir(where):
            if name.endswith(".wal"):
                os.unlink(os.path.join(where, name))
        for name in self.entries.get(where, set()):
            if name.endswith(".wal"):
                path = os.path.join(where, name)
                Path(path).write_bytes(self.durable.get(path, b""))


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    model = Disk(tmp_path)
    model.install(monkeypatch)
    yield model


def _config() -> StoreConfig:
    return StoreConfig(clock=lambda: 1_700_000_000.0, retention=3600.0, max_retained=100_000)


def _job(n: int) -> NewJob:
    return NewJob(task="t", payload={"n": n, "pad": "x" * 100}, priority=0, key=None, max_attempts=3)


async def _ids(directory: Path) -> set[str]:
    store = trioq.WALStore(directory)
    async with store.session(_config()):
        return {job.id for job in await store.jobs([trioq.JobState.READY], limit=10_000)}


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_a_kill_a_restart_then_a_power_cut_leave_a_log_that_opens(disk: Disk, tmp_path: Path, fsync: str) -> None:
    # Recovery read what a killed process left in the page cache and built on it
    # (its batches numbered on, a checkpoint's older segments deleted) without
    # syncing it: a power cut then took it back, and the log no longer opened.
    live = tmp_path / "live"
    copies: list[tuple[Path, int]] = []
    acked: list[str] = []

    def kill_here(path: str) -> None:
        copy = tmp_path / f"kill{len(copies)}"
        disk.kill_copy(live, copy)
        copies.append((copy, len(acked)))

    store = trioq.WALStore(live, fsync=fsync, segment_size=4096)
    disk.before_sync = kill_here
    async with store.session(_config()):
        for n in range(40):
            acked.extend(job.id for job in await store.add([_job(n)]))
            if n == 20:
                await store.checkpoint()
    disk.before_sync = None
    assert len(copies) > 10
    for copy, acked_before in copies:
        restarted = trioq.WALStore(copy, fsync=fsync, segment_size=4096)
        async with restarted.session(_config()):
            await restarted.add([_job(999)])
            await trio.sleep(0.02)  # "interval" syncs
        disk.power_cut(copy)
        assert verify_command(str(copy), io.StringIO(), io.StringIO()) == 0, copy
        present = await _ids(copy)  # opens
        if fsync == "always":
            assert set(acked[:acked_before]) <= present, copy


@pytest.mark.parametrize("lost", ["nothing", "zeros"], ids=["unsynced-gone", "unsynced-zeroed"])
async def test_a_power_cut_at_any_sync_of_an_interval_session_leaves_a_log_that_opens(
    disk: Disk, tmp_path: Path, lost: str
) -> None:
    # A roll synced the segment it left only after the next one was on disk:
    # a power cut between left an older segment cut short (or, on file systems
    # that show unwritten blocks as zeros, ending in zeros).
    live = tmp_path / "live"
    cuts: list[Path] = []

    def power_cut_here(path: str) -> None:
        copy = tmp_path / f"cut{len(cuts)}"
        copy.mkdir()
        for name in disk.entries.get(os.path.realpath(live), set()):
            if name.endswith(".wal"):
                source = os.path.join(os.path.realpath(live), name)
                data = disk.durable.get(source, b"")
                now = Path(source).read_bytes() if os.path.exists(source) else data
                if lost == "zeros" and now.startswith(data):
                    data += bytes(len(now) - len(data))
                (copy / name).write_bytes(data)
        cuts.append(copy)

    store = trioq.WALStore(live, fsync="interval", segment_size=4096)
    disk.before_sync = power_cut_here
    async with store.session(_config()):
        for n in range(60):
            await store.add([_job(n)])
            if n == 30:
                await store.checkpoint()
    disk.before_sync = None
    assert len(cuts) > 10
    for copy in cuts:
        assert verify_command(str(copy), io.StringIO(), io.StringIO()) == 0, copy
        await _ids(copy)
