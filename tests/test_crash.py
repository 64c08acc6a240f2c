"""kill -9 of a real process using a WALStore(fsync="always"), then a restart.

A child process enqueues jobs from 16 producers while 8 workers run them,
printing each job id once ``enqueue`` has returned (the acknowledgement) and
appending each job id to a file whenever an attempt starts. The test kills it
with SIGKILL after a number of acknowledgements, restarts on the same
directory in this process, drains, and checks invariants 1 and 3 of DESIGN.md:
every acknowledged job succeeds, and no job runs more than once plus the one
attempt the crash cut off.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import trioq
from trioq import JobState

pytestmark = pytest.mark.slow

TOTAL = 3000
PRODUCERS = 16
WORKERS = 8

CHILD = f"""
import os, sys, trio, trioq

directory, executions = sys.argv[1], sys.argv[2]
registry = trioq.Registry()
log = os.open(executions, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

@registry.task(name="work")
async def work(ctx, n):
    os.write(log, (ctx.job.id + "\\n").encode())  # one line per execution, at its start
    await trio.sleep(0)

async def produce(queue, first):
    for n in range(first, {TOTAL}, {PRODUCERS}):
        job = await queue.enqueue("work", {{"n": n}})
        sys.stdout.write(job.id + "\\n")
        sys.stdout.flush()

async def main():
    store = trioq.WALStore(directory, fsync="always")
    async with trioq.open_queue(registry, store=store, workers={WORKERS}) as queue:
        async with trio.open_nursery() as nursery:
            for first in range({PRODUCERS}):
                nursery.start_soon(produce, queue, first)
        await queue.join()
    sys.stdout.write("DONE\\n")
    sys.stdout.flush()

trio.run(main)
"""


async def _run_and_kill(directory: Path, executions: Path, kill_after: int, script: str = CHILD) -> list[str]:
    """Run the child ``script`` until ``kill_after`` acks, SIGKILL it; every id it acknowledged."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", script, str(directory), str(executions)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    buffer = b""
    acked: list[str] = []
    try:
        with trio.fail_after(15):
            while len(acked) < kill_after:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    err = await process.stderr.receive_some()
                    pytest.fail(f"child ended after {len(acked)} acks: {err.decode(errors='replace')}")
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                acked.extend(line.decode() for line in lines)
            process.send_signal(signal.SIGKILL)
            await process.wait()
            # Acks printed before the kill landed are acks too.
            while chunk := await process.stdout.receive_some():
                buffer += chunk
            *lines, _partial = buffer.split(b"\n")  # a cut-off last line names no job for sure
            acked.extend(line.decode() for line in lines)
    finally:
        if process.returncode is None:
            process.kill()
            with trio.move_on_after(5):
                await process.wait()
        await process.stdout.aclose()
        await process.stderr.aclose()
    assert process.returncode == -signal.SIGKILL
    assert "DONE" not in acked, "the child finished before it was killed; kill earlier"
    return acked


@pytest.mark.parametrize("kill_after", [50, TOTAL // 4, TOTAL // 2], ids=["early", "quarter", "half"])
async def test_kill_9_loses_no_acknowledged_job(tmp_path: Path, kill_after: int) -> None:
    directory = tmp_path / "wal"
    executions = tmp_path / "executions"
    acked = await _run_and_kill(directory, executions, kill_after)
    assert len(acked) >= kill_after
    assert len(set(acked)) == len(acked)
    before_restart = collections.Counter(executions.read_text().split())

    registry = trioq.Registry()
    rerun: collections.Counter[str] = collections.Counter()

    @registry.task(name="work")
    async def work(ctx: trioq.JobContext, n: int) -> None:
        rerun[ctx.job.id] += 1

    with trio.fail_after(15):
        store = trioq.WALStore(directory, fsync="always")
        async with trioq.open_queue(registry, store=store, workers=WORKERS) as queue:
            await queue.join()
            final = {job_id: await queue.get(job_id) for job_id in acked}
            stats = await queue.stats()

    # Invariant 1: everything acknowledged reached a terminal state; here, success.
    not_done = {job_id: job.state.value for job_id, job in final.items() if job.state is not JobState.SUCCEEDED}
    assert not_done == {}
    jobs = stats["jobs"]
    assert jobs["ready"] == jobs["scheduled"] == jobs["running"] == jobs["dead"] == jobs["cancelled"] == 0
    assert jobs["succeeded"] >= len(acked)
    # Invariant 3: at most one attempt cut off by the crash, plus the one that finished.
    executions_per_job = before_restart + rerun
    over = {job_id: n for job_id, n in executions_per_job.items() if n > 2}
    assert over == {}
    assert all(executions_per_job[job_id] >= 1 for job_id in acked)
    # A job the crash interrupted ran again; nothing ran twice after the restart.
    assert max(rerun.values(), default=0) <= 1
    # Only jobs that were cut off (or never started) ran after the restart.
    assert all(before_restart[job_id] <= 1 for job_id in rerun)
    assert all(job.attempts == 1 for job in final.values())
    print(
        f"kill after {kill_after}: {len(acked)} acked, {sum(before_restart.values())} executions before the kill, "
        f"{len(rerun)} run after the restart, "
        f"{sum(1 for job_id in rerun if before_restart[job_id])} of those were cut off by the crash"
    )
