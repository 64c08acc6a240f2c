"""What comes out of ``open_queue`` when several things fail at once: one error, as itself."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
import trio.testing

import trioq
from trioq import JobSpec
from trioq._runtime.exits import primary_error
from trioq.stores import ClaimRequest
from trioq.stores.wal import _writer

from ._sigint import default_sigint


class _BrokenClaims(trioq.MemoryStore):
    """A MemoryStore whose claims fail once ``broken`` is set, like a store whose disk went away."""

    broken = False

    async def claim(self, request: ClaimRequest) -> list[trioq.Job]:
        if self.broken:
            raise OSError(errno.EIO, "claim failed: the store is gone")
        return await super().claim(request)


async def _store_fails_then(store: _BrokenClaims, queue: trioq.Queue) -> None:
    """Break the store, wake a worker into it, and wait (shielded) until the pool has failed."""
    store.broken = True
    await queue.enqueue("noop")
    with trio.CancelScope(shield=True):
        await trio.sleep(1)


def _registry() -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    return registry


async def test_a_ctrl_c_beside_a_store_failure_comes_out_as_keyboard_interrupt(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Two SIGINTs ~0.5 ms apart once gave BaseExceptionGroup([KeyboardInterrupt, RuntimeError]).
    store = _BrokenClaims()
    with pytest.raises(KeyboardInterrupt) as excinfo:
        async with trioq.open_queue(_registry(), store=store, workers=2) as queue:
            await _store_fails_then(store, queue)
            raise KeyboardInterrupt
    assert type(excinfo.value) is KeyboardInterrupt
    assert any("OSError: [Errno 5] claim failed" in note for note in getattr(excinfo.value, "__notes__", []))
    logged = [r for r in caplog.records if r.name == "trioq" and r.exc_info is not None]
    assert [type(r.exc_info[1]) for r in logged if r.exc_info] == [OSError]


async def test_the_blocks_own_error_wins_over_a_store_failure(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = _BrokenClaims()
    with pytest.raises(ValueError, match="the block's own") as excinfo:
        async with trioq.open_queue(_registry(), store=store, workers=2) as queue:
            await _store_fails_then(store, queue)
            raise ValueError("the block's own")
    assert type(excinfo.value) is ValueError
    assert any("claim failed" in r.getMessage() or r.exc_info for r in caplog.records if r.name == "trioq")


@pytest.mark.parametrize("workers", [0, 4])
async def test_a_full_disk_comes_out_as_one_oserror(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk once gave an ExceptionGroup of two OSErrors: the writer's own,
    # and the very same object raised again to the caller waiting for its commit.
    room = 64 * 1024
    real_write_at = _writer._write_at

    def small_disk(fd: int, data: bytes | memoryview, offset: int) -> None:
        if offset + len(data) > room:
            real_write_at(fd, data[: max(room - offset, 0)], offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write_at(fd, data, offset)

    monkeypatch.setattr(_writer, "_write_at", small_disk)
    registry = _registry()
    with pytest.raises(OSError) as excinfo:
        async with trioq.open_queue(registry, store=trioq.WALStore(tmp_path / "wal"), workers=workers) as queue:
            with trio.fail_after(30):
                while True:
                    await queue.enqueue_many([JobSpec("noop") for _ in range(20)])
    assert type(excinfo.value) is OSError and excinfo.value.errno == errno.ENOSPC
    assert excinfo.value.__cause__ is not None  # a copy for this caller, caused by the writer's


_DOUBLE_SIGINT = textwrap.dedent(
    """
    import os, signal, sys, threading, time, trio, trioq

    registry = trioq.Registry()

    @registry.task
    async def work(ctx):
        await trio.sleep(0.001)

    def kick():
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGINT)

    async def main(directory):
        async with trioq.open_queue(registry, store=trioq.WALStore(directory), workers=16) as queue:
            threading.Thread(target=kick, daemon=True).start()
            while True:
                await queue.enqueue_many([trioq.JobSpec("work") for _ in range(20)])

    for n in range(int(sys.argv[2])):
        try:
            trio.run(main, f"{sys.argv[1]}/{n}")
        except BaseException as exc:
            print(type(exc).__name__, flush=True)
    """
)


@pytest.mark.slow
def test_two_quick_sigints_come_out_as_one_keyboard_interrupt(tmp_path: Path) -> None:
    script = tmp_path / "double_sigint.py"
    script.write_text(_DOUBLE_SIGINT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "6"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=default_sigint,  # only signal calls between fork and exec
    )
    assert done.stdout.split() == ["KeyboardInterrupt"] * 6, done.stdout + done.stderr


def test_an_error_raised_from_a_ctrl_c_does_not_hide_it() -> None:
    interrupt = KeyboardInterrupt()
    derived = RuntimeError("the writer stopped")
    derived.__cause__ = interrupt
    copy = OSError(28, "No space left on device")
    copy.__cause__ = original = OSError(28, "No space left on device")
    assert primary_error(BaseExceptionGroup("", [derived, interrupt]), None) is interrupt
    assert primary_error(BaseExceptionGroup("", [original, copy]), None) is copy  # a copy stands for its cause
    assert not hasattr(copy, "__notes__")
