"""Hung, slow and stuck attempts: deadlines, heartbeats, the watcher, threads, processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trioq
from trioq import Backoff, JobSpec, JobState
from trioq._runtime.pool import STUCK_GRACE

NO_WAIT = Backoff(base=0.0, jitter=0.0)


async def test_hung_async_attempt_is_detected_and_retried(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    starts: list[float] = []

    @registry.task(heartbeat_timeout=5.0, backoff=NO_WAIT)
    async def hangs_once(ctx: trioq.JobContext) -> str:
        starts.append(trio.current_time())
        if ctx.attempt == 1:
            await trio.sleep_forever()  # no heartbeats: a hang
        return "second time lucky"

    async with trioq.open_queue(registry, workers=2) as queue:
        job = await queue.enqueue("hangs_once")
        final = await queue.wait(job.id)
        stats = await queue.stats()

    assert final.state is JobState.SUCCEEDED
    assert final.attempts == 2  # the hang counted as a failed attempt
    assert final.result == "second time lucky"
    assert starts[1] - starts[0] == pytest.approx(5.0, abs=1e-3)
    assert stats["totals"]["hung"] == 1
    assert stats["workers"]["replaced"] == 0  # a cancellable hang needs no replacement


async def test_hang_error_text_says_it_hung_and_timeout_says_timed_out(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def silent(ctx: trioq.JobContext) -> None:
        await trio.sleep_forever()

    @registry.task(max_attempts=1, timeout=3.0)
    async def slow(ctx: trioq.JobContext) -> None:
        while True:
            ctx.heartbeat()
            await trio.sleep(0.5)

    async with trioq.open_queue(registry, heartbeat_timeout=2.0) as queue:
        hung = await queue.wait((await queue.enqueue("silent")).id)
        timed_out = await queue.wait((await queue.enqueue("slow")).id)
        stats = await queue.stats()
    assert hung.state is JobState.DEAD and hung.error is not None and "hung" in hung.error
    assert "no heartbeat for 2s" in hung.error
    assert timed_out.state is JobState.DEAD and timed_out.error is not None
    assert "timed out after 3s" in timed_out.error
    assert stats["totals"]["hung"] == 1 and stats["totals"]["timed_out"] == 1


async def test_heartbeating_long_job_is_never_a_false_hang(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task(heartbeat_timeout=1.0, max_attempts=1)
    async def marathon(ctx: trioq.JobContext) -> int:
        for _ in range(600):  # 60 s of work, a heartbeat every 0.1 s
            await trio.sleep(0.1)
            assert ctx.heartbeat()
        return 600

    async with trioq.open_queue(registry) as queue:
        final = await queue.wait((await queue.enqueue("marathon")).id)
        stats = await queue.stats()
    assert final.state is JobState.SUCCEEDED and final.attempts == 1
    assert stats["totals"]["hung"] == 0


async def test_task_heartbeat_timeout_overrides_queue_default(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task(heartbeat_timeout=10.0, max_attempts=1)
    async def patient(ctx: trioq.JobContext) -> str:
        await trio.sleep(5.0)  # longer than the queue's 1 s, shorter than its own 10 s
        return "fine"

    async with trioq.open_queue(registry, heartbeat_timeout=1.0) as queue:
        final = await queue.wait((await queue.enqueue("patient")).id)
    assert final.state is JobState.SUCCEEDED


async def test_shielded_hang_replaces_worker_and_requeues_under_new_epoch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = trioq.Registry()
    running = 0
    peak = 0
    late_returns: list[int] = []

    @registry.task(heartbeat_timeout=2.0, backoff=NO_WAIT)
    async def stubborn(ctx: trioq.JobContext, n: int) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            if n == 0 and ctx.attempt == 1:
                with trio.CancelScope(shield=True):
                    await trio.sleep(50)  # ignores its deadline entirely
                late_returns.append(ctx.job.epoch)
                return "late result"
            await trio.sleep(1.0)
            return f"ok {ctx.job.epoch}"
        finally:
            running -= 1

    async with trioq.open_queue(registry, workers=2) as queue:
        first = await queue.enqueue("stubborn", {"n": 0})
        await trio.sleep(2.0 + STUCK_GRACE + 0.5)
        stats = await queue.stats()
        assert stats["workers"]["unhealthy"] == 1
        assert stats["workers"]["healthy"] == 2
        assert stats["workers"]["replaced"] == 1
        others = [await queue.enqueue("stubborn", {"n": n}) for n in range(1, 7)]
        requeued = await queue.wait(first.id)
        for job in others:
            await queue.wait(job.id)
        await trio.sleep(60)  # let the stuck attempt return; its result must be refused
        after = await queue.get(first.id)
        stats = await queue.stats()

    assert requeued.state is JobState.SUCCEEDED
    assert requeued.result == "ok 2"  # the second epoch completed it
    assert requeued.attempts == 2
    assert late_returns == [1]
    assert after.result == "ok 2"  # the late return of epoch 1 changed nothing
    # At most two attempts alive at once, plus the one stuck attempt that lost its job.
    assert peak <= 3
    assert stats["workers"]["unhealthy"] == 0  # the stuck task exited when it returned
    assert stats["totals"]["stuck"] == 1


async def test_stuck_worker_never_adds_a_slot(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    live_healthy = 0
    peak_healthy = 0

    @registry.task(heartbeat_timeout=1.0, backoff=NO_WAIT, max_attempts=1)
    async def stuck(ctx: trioq.JobContext) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(30)

    @registry.task
    async def normal(ctx: trioq.JobContext) -> None:
        nonlocal live_healthy, peak_healthy
        live_healthy += 1
        peak_healthy = max(peak_healthy, live_healthy)
        await trio.sleep(0.5)
        live_healthy -= 1

    async with trioq.open_queue(registry, workers=3) as queue:
        await queue.enqueue_many([trioq.JobSpec("stuck") for _ in range(3)])
        await trio.sleep(1.0 + STUCK_GRACE + 0.1)
        stats = await queue.stats()
        assert stats["workers"]["unhealthy"] == 3 and stats["workers"]["healthy"] == 3
        await queue.enqueue_many([trioq.JobSpec("normal") for _ in range(30)])
        await queue.join()
        dead = (await queue.stats())["jobs"]["dead"]
    assert peak_healthy == 3
    assert dead == 3


async def test_thread_handler_ignoring_deadline_is_abandoned_and_its_late_result_discarded() -> None:
    """Real clock, short: under an autojump clock virtual time leaps while any thread runs,
    so every thread attempt with a deadline would time out."""
    registry = trioq.Registry()
    release_thread = threading.Event()
    thread_finished = threading.Event()
    late_heartbeat: list[bool] = []

    @registry.task(kind="thread", timeout=0.2, backoff=NO_WAIT)
    def blocking(ctx: trioq.JobContext) -> str:
        if ctx.attempt == 1:
            release_thread.wait(10)  # ignores the deadline
            late_heartbeat.append(ctx.heartbeat())
            thread_finished.set()
            return "late"
        return "fresh"

    with trio.fail_after(10):
        async with trioq.open_queue(registry, workers=1) as queue:
            job = await queue.enqueue("blocking")
            final = await queue.wait(job.id)
            stats = await queue.stats()
            release_thread.set()
            await trio.to_thread.run_sync(thread_finished.wait, 10)
            await trio.sleep(0.05)
            after = await queue.get(job.id)
            stats_after = await queue.stats()

    assert final.state is JobState.SUCCEEDED and final.result == "fresh" and final.attempts == 2
    assert stats["workers"]["abandoned_threads"] == 1
    assert stats["totals"]["timed_out"] == 1
    assert late_heartbeat == [False]  # the abandoned attempt learns it lost the job
    assert after.result == "fresh" and after.epoch == 2  # the late "late" was discarded
    assert stats_after["workers"]["abandoned_threads"] == 0
    assert stats_after["workers"]["abandoned_threads_total"] == 1


async def test_thread_handler_heartbeat_is_thread_safe() -> None:
    """Real clock (see above): 8 jobs, each heartbeating 50 times from its thread."""
    registry = trioq.Registry()
    seen_threads: set[int] = set()

    @registry.task(kind="thread")
    def beats(ctx: trioq.JobContext, n: int) -> int:
        seen_threads.add(threading.get_ident())
        return sum(1 for _ in range(n) if ctx.heartbeat())

    with trio.fail_after(10):
        async with trioq.open_queue(registry, workers=4, heartbeat_timeout=30.0) as queue:
            jobs = await queue.enqueue_many([trioq.JobSpec("beats", {"n": 50}) for _ in range(8)])
            results = [(await queue.wait(j.id)).result for j in jobs]
    assert results == [50] * 8
    assert threading.get_ident() not in seen_threads


@pytest.mark.slow
async def test_cpu_bound_thread_job_that_heartbeats_is_not_a_false_hang() -> None:
    """Real clock: an autojump clock would leap past the deadline while the thread computes."""
    registry = trioq.Registry()

    @registry.task(kind="thread", heartbeat_timeout=0.25, max_attempts=1)
    def crunch(ctx: trioq.JobContext, seconds: float) -> int:
        import hashlib

        end = time.monotonic() + seconds
        rounds = 0
        digest = b""
        next_beat = 0.0
        while (now := time.monotonic()) < end:
            if now >= next_beat:
                ctx.heartbeat()
                next_beat = now + 0.02
            digest = hashlib.sha256(digest).digest()
            rounds += 1
        return rounds

    with trio.fail_after(10):
        async with trioq.open_queue(registry, workers=2) as queue:
            job = await queue.enqueue("crunch", {"seconds": 1.0})
            final = await queue.wait(job.id)
            stats = await queue.stats()
    assert final.state is JobState.SUCCEEDED and final.attempts == 1
    assert stats["totals"]["hung"] == 0 and stats["workers"]["abandoned_threads_total"] == 0


@pytest.mark.slow
async def test_process_handlers_run_kill_on_timeout_and_heartbeat_across_processes() -> None:
    from tests import handlers

    registry = trioq.Registry()
    registry.add(handlers.square, kind="process")
    registry.add(handlers.spin, kind="process", timeout=0.5, max_attempts=1)
    registry.add(handlers.spin_beating, kind="process", heartbeat_timeout=0.3, max_attempts=1)
    registry.add(handlers.explode, kind="process", max_attempts=1)

    with trio.fail_after(30):
        async with trioq.open_queue(registry, workers=2) as queue:
            square = await queue.enqueue("square", {"n": 12})
            assert (await queue.wait(square.id)).result == 144  # also warms the process pool
            t0 = time.monotonic()
            spin = await queue.enqueue("spin", {"seconds": 20.0})
            killed = await queue.wait(spin.id)
            killed_after = time.monotonic() - t0
            beating = await queue.enqueue("spin_beating", {"seconds": 1.2})
            explode = await queue.enqueue("explode")
            beat_final = await queue.wait(beating.id)
            exploded = await queue.wait(explode.id)
            board = queue._pool.pools[0].executor.processes._board
            assert board is not None and Path(board.path).exists()

    assert not Path(board.path).exists()  # no leaks: the heartbeat board goes with the queue
    assert killed.state is JobState.DEAD and killed.error is not None and "timed out" in killed.error
    assert killed_after < 5.0  # the 20 s computation was killed at its 0.5 s deadline
    assert beat_final.state is JobState.SUCCEEDED, beat_final.error
    assert exploded.state is JobState.DEAD and exploded.error == "ValueError: boom in a process"


_ORPHAN_NODE = """
import sys, trio, trioq
sys.path.insert(0, sys.argv[2])
from tests import handlers

async def main():
    registry = trioq.Registry()
    registry.add(handlers.pid_then_sleep, kind="process", max_attempts=1)
    async with trioq.open_queue(registry, workers=1) as queue:
        await queue.enqueue("pid_then_sleep", {"path": sys.argv[1], "seconds": 60.0})
        await trio.sleep(120)

trio.run(main)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: not gone, nor a zombie waiting for init to reap it (Linux's ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_a_process_handler_ends_when_its_node_is_sigkilled(tmp_path: Path) -> None:
    """A node SIGKILLed mid-attempt: its worker process exits within a second, not when its handler
    returns. (It ran on for the handler's whole length while another node, its lease lapsed, could run
    the same job: found by a hostile review.)"""
    import os
    import signal
    import subprocess
    import sys

    pid_file = tmp_path / "worker.pid"
    root = str(Path(__file__).resolve().parent.parent)
    node = subprocess.Popen([sys.executable, "-c", _ORPHAN_NODE, str(pid_file), root])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and node.poll() is None, "the handler never started"
            time.sleep(0.02)
        worker = int(pid_file.read_text())
        node.send_signal(signal.SIGKILL)
        node.wait(10)
        killed = time.monotonic()
        while time.monotonic() - killed < 5 and _running(worker):
            time.sleep(0.02)
        gone_after = time.monotonic() - killed
    finally:
        node.kill()
        node.wait(10)
    outlived = _running(worker)
    if outlived:
        os.kill(worker, signal.SIGKILL)  # the test's own clean-up
    assert not outlived and gone_after < 1.0, gone_after


@pytest.mark.slow
async def test_process_job_cancelled_while_waiting_for_a_cpu_never_runs(tmp_path: Path) -> None:
    import os

    from tests import handlers

    registry = trioq.Registry()
    registry.add(handlers.spin, kind="process", max_attempts=1)
    registry.add(handlers.touch, kind="process", max_attempts=1)
    cpus = os.cpu_count() or 1
    mark = tmp_path / "ran"
    with trio.fail_after(30):
        async with trioq.open_queue(registry, workers=cpus + 1) as queue:
            spins = [await queue.enqueue("spin", {"seconds": 1.0}) for _ in range(cpus)]
            await trio.sleep(0.2)
            waiting = await queue.enqueue("touch", {"path": str(mark)})
            while (await queue.get(waiting.id)).state is not JobState.RUNNING:  # noqa: ASYNC110 - polling the store
                await trio.sleep(0.01)
            await queue.cancel(waiting.id)
            for job in spins:
                await queue.wait(job.id)
            await trio.sleep(0.2)
            final = await queue.get(waiting.id)
    assert final.state is JobState.CANCELLED
    assert not mark.exists()


#: Shielded hold times for the waves below, on either side of timeout (0.3 s) and
#: timeout + STUCK_GRACE (1.3 s), never on a boundary: what happens is then exact.
_HOLDS = (0.1, 0.5, 1.5, 3.0, 9.0)
_WAVE_TIMEOUT = 0.3


def _expected(holds: list[float]) -> tuple[JobState, int]:
    """What the queue must make of a job whose attempts hold for ``holds`` seconds each."""
    for attempt, hold in enumerate(holds, 1):
        if hold < _WAVE_TIMEOUT + STUCK_GRACE:
            return JobState.SUCCEEDED, attempt  # on time, or late within the grace: its result stands
    return JobState.DEAD, len(holds)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=st.integers(1, 3),
    jobs=st.lists(
        st.tuples(st.sampled_from((0.0, 0.7, 2.0, 5.0)), st.lists(st.sampled_from(_HOLDS), min_size=2, max_size=2)),
        min_size=1,
        max_size=6,
    ),
)
def test_waves_of_stuck_workers_are_all_caught_and_the_pool_recovers(
    workers: int, jobs: list[tuple[float, list[float]]]
) -> None:
    """Stuck attempts arriving in waves, replacements getting stuck in turn: every attempt
    past its deadline plus the grace is declared stuck (so no late result is accepted),
    never more than ``workers`` attempts that are not stuck run at once, every job ends as
    its attempts say, and once the stuck bodies return the pool is whole again."""
    registry = trioq.Registry()
    running: dict[tuple[str, int], float] = {}
    overcommitted: list[str] = []

    @registry.task(timeout=_WAVE_TIMEOUT, max_attempts=2, backoff=Backoff(base=0.01, jitter=0.0))
    async def stubborn(ctx: trioq.JobContext, holds: list[float]) -> int:
        now = trio.current_time()
        running[ctx.job.id, ctx.attempt] = now
        live = sum(1 for started in running.values() if now < started + _WAVE_TIMEOUT + STUCK_GRACE)
        if live > workers:
            overcommitted.append(f"{live} live attempts at {now:.2f}")
        try:
            with trio.CancelScope(shield=True):
                await trio.sleep(holds[ctx.attempt - 1])
        finally:
            del running[ctx.job.id, ctx.attempt]
        return ctx.attempt

    @registry.task
    async def quick(ctx: trioq.JobContext) -> str:
        return "ran"

    async def main() -> None:
        async with trioq.open_queue(registry, workers=workers, shutdown_grace=0) as queue:
            ids = [(await queue.enqueue("stubborn", {"holds": holds}, delay=at)).id for at, holds in jobs]
            with trio.fail_after(200):
                await queue.join()
            await trio.sleep(max(_HOLDS) + 1)  # every stuck body has returned
            stats = await queue.stats()
            probe = await queue.enqueue("quick")
            with trio.fail_after(5):
                assert (await queue.wait(probe.id)).result == "ran"
            for job_id, (_, holds) in zip(ids, jobs, strict=True):
                job = await queue.get(job_id)
                assert (job.state, job.attempts) == _expected(holds), (holds, job)
                if job.state is JobState.SUCCEEDED:
                    assert job.result == job.attempts  # the result of the attempt that counted
        assert overcommitted == []
        assert stats["workers"]["healthy"] == workers
        assert stats["workers"]["unhealthy"] == 0
        assert stats["workers"]["busy"] == 0
        stuck = sum(1 for _, holds in jobs for hold in holds[: _expected(holds)[1]] if hold > 1.3)
        assert stats["totals"]["stuck"] == stuck
        assert stats["workers"]["replaced"] == stuck

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_hang_runs_again_at_once_and_a_timeout_after_its_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """DESIGN.md section 4 (decided): the wait for the missed heartbeat was the delay."""
    registry = trioq.Registry()
    starts: dict[str, list[float]] = {"silent": [], "slow": [], "shielded": []}
    slow_backoff = Backoff(base=30.0, jitter=0.0)

    @registry.task(heartbeat_timeout=2.0, backoff=slow_backoff, max_attempts=2)
    async def silent(ctx: trioq.JobContext) -> None:
        starts["silent"].append(trio.current_time())
        if ctx.attempt == 1:
            await trio.sleep_forever()

    @registry.task(timeout=2.0, backoff=slow_backoff, max_attempts=2)
    async def slow(ctx: trioq.JobContext) -> None:
        starts["slow"].append(trio.current_time())
        if ctx.attempt == 1:
            await trio.sleep_forever()

    @registry.task(heartbeat_timeout=2.0, backoff=slow_backoff, max_attempts=2)
    async def shielded(ctx: trioq.JobContext) -> None:
        starts["shielded"].append(trio.current_time())
        if ctx.attempt == 1:
            with trio.CancelScope(shield=True):
                await trio.sleep(10.0)  # declared stuck after the grace

    async with trioq.open_queue(registry, workers=3) as queue:
        jobs = await queue.enqueue_many([JobSpec(name) for name in starts])
        for job in jobs:
            assert (await queue.wait(job.id)).state is JobState.SUCCEEDED
    assert starts["silent"][1] - starts["silent"][0] == pytest.approx(2.0, abs=1e-3)
    assert starts["shielded"][1] - starts["shielded"][0] == pytest.approx(2.0 + STUCK_GRACE, abs=1e-3)
    assert starts["slow"][1] - starts["slow"][0] == pytest.approx(2.0 + 30.0, abs=1e-3)


async def test_a_cancelled_shielded_attempt_whose_job_runs_again_is_still_declared_stuck(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Live attempts are kept by job id: retrying the cancelled job let its new
    # attempt take the old one's place, and the old body (still running,
    # shielded) was never declared stuck: its slot was lost, counted as idle.
    registry = trioq.Registry()
    second_start = trio.Event()

    @registry.task
    async def shielded(ctx: trioq.JobContext) -> None:
        if ctx.job.epoch == 1:
            with trio.CancelScope(shield=True):
                await trio.sleep(100)
        else:
            second_start.set()

    @registry.task
    async def second(ctx: trioq.JobContext) -> None:
        await trio.sleep(1.0)

    async with trioq.open_queue(registry, workers=2) as queue:
        job = await queue.enqueue("shielded")
        await trio.sleep(1.0)
        await queue.cancel(job.id)
        await queue.retry(job.id)
        await second_start.wait()
        await trio.sleep(STUCK_GRACE + 1.0)
        stats = (await queue.stats())["workers"]
        assert (stats["unhealthy"], stats["replaced"], stats["healthy"]) == (1, 1, 2)
        started = trio.current_time()
        jobs = await queue.enqueue_many([JobSpec("second"), JobSpec("second")])
        for each in jobs:
            await queue.wait(each.id)
        assert trio.current_time() - started == pytest.approx(1.0, abs=1e-3)  # two free workers, in parallel


async def test_a_heartbeat_after_the_deadline_is_too_late(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    starts: list[float] = []
    late_beats: list[bool] = []

    @registry.task(heartbeat_timeout=3.0, timeout=10.0, backoff=Backoff(base=60.0, jitter=0.0), max_attempts=2)
    async def hangs(ctx: trioq.JobContext) -> None:
        starts.append(trio.current_time())
        if ctx.attempt == 1:
            try:
                await trio.sleep_forever()
            finally:
                late_beats.append(ctx.heartbeat())  # in the cleanup, past the heartbeat deadline

    async with trioq.open_queue(registry, workers=1) as queue:
        done = await queue.wait((await queue.enqueue("hangs")).id)
    assert late_beats == [False]
    assert done.state is JobState.SUCCEEDED and done.attempts == 2
    assert starts[1] - starts[0] == pytest.approx(3.0, abs=1e-3)  # a hang: again at once, not after 60 s
