"""`trioq wal verify` and `trioq wal inspect` on healthy, torn and damaged logs."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import trio
import trio.testing

import trioq
from trioq._app.walcli import inspect_command, verify_command
from trioq.stores import StoreConfig


async def _make_log(directory: Path) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    store = trioq.WALStore(directory, fsync="never", segment_size=4096)
    async with trioq.open_queue(registry, store=store, workers=4) as queue:
        jobs = await queue.enqueue_many([trioq.JobSpec("noop") for _ in range(200)])
        await queue.enqueue("noop", delay=500)
        for job in jobs:
            await queue.wait(job.id)


def _run(command: object, directory: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = command(str(directory), out, err)  # type: ignore[operator]
    return code, out.getvalue(), err.getvalue()


async def test_verify_and_inspect_a_healthy_log(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    await _make_log(tmp_path)
    code, out, err = _run(verify_command, tmp_path)
    assert code == 0 and err == ""
    assert out.startswith("ok: ") and "201 jobs" in out and len(out.strip().splitlines()) == 1
    code, out, _ = _run(inspect_command, tmp_path)
    assert code == 0
    assert "succeeded         200" in out and "scheduled           1" in out
    assert "00000000000000000001.wal" in out and "last checkpoint:" in out


async def test_verify_reports_a_torn_tail_but_passes(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    await _make_log(tmp_path)
    last = sorted(tmp_path.glob("*.wal"))[-1]
    with last.open("ab") as f:
        f.write(b"\x10\x00\x00\x00half a record")
    code, out, _ = _run(verify_command, tmp_path)
    assert code == 0 and "torn tail of 17 bytes" in out
    assert last.stat().st_size > 0  # verify only reads: nothing truncated


async def test_verify_fails_on_damage_naming_segment_and_offset(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _make_log(tmp_path)
    first = sorted(tmp_path.glob("*.wal"))[0]
    data = bytearray(first.read_bytes())
    data[100] ^= 0xFF
    first.write_bytes(bytes(data))
    code, out, err = _run(verify_command, tmp_path)
    assert code == 1 and out == ""
    assert first.name in err and "byte offset" in err
    code, _, err = _run(inspect_command, tmp_path)
    assert code == 1 and first.name in err


def test_cli_entry_point_exit_codes(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "trioq", "wal", "verify", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "no WAL directory" in missing.stderr
    empty = subprocess.run(
        [sys.executable, "-m", "trioq", "wal", "verify", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert empty.returncode == 0 and empty.stdout.startswith("ok: 0 segment(s)")


async def test_verify_and_inspect_name_each_segments_format(tmp_path: Path) -> None:
    # A log trioq wrote in format 2 (tests/stores/data), then opened by this
    # trioq: its old segments stay format 2 until a checkpoint, new ones are 4.
    wal = tmp_path / "wal"
    shutil.copytree(Path(__file__).parent / "stores" / "data" / "wal_v2", wal)
    code, out, err = _run(verify_command, wal)
    assert (code, err) == (0, "")
    assert out.startswith("ok: 2 segment(s) (format 2), ") and "56 jobs" in out
    store = trioq.WALStore(wal, fsync="never")
    async with store.session(StoreConfig(clock=lambda: 1_700_004_010.0)):
        pass
    code, out, _ = _run(verify_command, wal)
    assert code == 0 and out.startswith("ok: 3 segment(s) (formats 2, 6), ") and "56 jobs" in out
    code, out, _ = _run(inspect_command, wal)
    assert code == 0
    lines = [line.split() for line in out.splitlines() if line.strip().endswith(".wal") or ".wal " in line]
    assert [(line[0], line[2]) for line in lines] == [
        ("00000000000000000002.wal", "2"),
        ("00000000000000000003.wal", "2"),
        ("00000000000000000004.wal", "6"),
    ]


async def test_verify_and_inspect_read_queues_pauses_and_expiries(tmp_path: Path) -> None:
    # Format 4's records (ADD with a queue, tenant and deadline; EXPIRE, PAUSE,
    # RESUME) replay in verify, and inspect names the paused queues.
    from trioq.stores import ClaimRequest, NewJob

    clock = [1_700_000_000.0]
    store = trioq.WALStore(tmp_path, fsync="never")
    async with store.session(StoreConfig(clock=lambda: clock[0])):
        await store.add([NewJob("t", {}, 0, None, 3, 0.0, "email", "acme", 5.0), NewJob("t", {}, 0, None, 3)])
        assert await store.pause("email") and await store.pause("reports") and await store.resume("reports")
        clock[0] += 10.0
        assert await store.promote() is None  # the deadline passed: EXPIRE
        await store.sync()
    code, out, err = _run(verify_command, tmp_path)
    assert (code, err) == (0, "") and out.startswith("ok: 1 segment(s) (format 6), ") and "2 jobs" in out
    code, out, _ = _run(inspect_command, tmp_path)
    assert code == 0 and "paused queues: email\n" in out and "cancelled           1" in out
    # Format 5's: an ADD deferred past the bound, and its ADMIT once a claim makes room.
    async with store.session(StoreConfig(clock=lambda: clock[0], defer_past=1)):
        (deferred,) = await store.add([NewJob("t", {}, 0, None, 3)])
        assert deferred.state == "deferred"
        await store.sync()
    code, out, _ = _run(inspect_command, tmp_path)
    assert code == 0 and "deferred            1" in out, out
    async with store.session(StoreConfig(clock=lambda: clock[0], defer_past=1)):
        assert len(await store.claim(ClaimRequest("n", 1, 30.0))) == 1  # admits the deferred job
        await store.sync()
    code, out, err = _run(verify_command, tmp_path)
    assert (code, err) == (0, "") and "3 jobs" in out, out
