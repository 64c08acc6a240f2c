"""trioq.testing: fault plans applied to real queues, on the autojump clock."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trioq
from trioq.testing import FaultPlan, InjectedFailure, SimulatedCrash, assert_all_terminal, crash_points

NO_JITTER = trioq.Backoff(base=1.0, factor=2.0, jitter=0.0)

registry = trioq.Registry()
calls: list[tuple[str, int]] = []


@registry.task(timeout=10.0, backoff=NO_JITTER)
async def pay(ctx: trioq.JobContext, n: int) -> int:
    calls.append(("pay", n))
    await trio.sleep(0.5)
    return n


@registry.task(backoff=NO_JITTER)
async def unbounded(ctx: trioq.JobContext) -> None:
    calls.append(("unbounded", ctx.attempt))


@registry.task(kind="thread", backoff=NO_JITTER)
def digest(ctx: trioq.JobContext, n: int) -> int:
    calls.append(("digest", n))
    return n * 2


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    calls.clear()


# ----------------------------------------------------------------- decisions


rules = st.lists(
    st.tuples(
        st.sampled_from(["fail", "hang", "delay"]),
        st.sampled_from(["a", "b", "*"]),
        st.one_of(st.none(), st.integers(1, 4)),
        st.one_of(st.none(), st.floats(0.0, 1.0)),
    ),
    max_size=5,
)
queries = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 50), st.integers(1, 6)), max_size=40)


def build(seed: int, spec: list[tuple[str, str, int | None, float | None]]) -> FaultPlan:
    plan = FaultPlan(seed=seed)
    for kind, task, times, prob in spec:
        if kind == "delay":
            plan.delay(task, 1.0, times=times, prob=prob)
        else:
            getattr(plan, kind)(task, times=times, prob=prob)
    return plan


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**64), spec=rules, asked=queries)
def test_same_seed_same_decisions_in_any_order(seed: int, spec: Any, asked: Any) -> None:
    first, second = build(seed, spec), build(seed, spec)
    forward = [first.decide(*q) for q in asked]
    backward = [second.decide(*q) for q in reversed(asked)][::-1]
    assert forward == backward
    assert forward == [first.decide(*q) for q in asked]  # asking again changes nothing


def test_times_limits_attempts_and_prob_draws_per_attempt() -> None:
    plan = FaultPlan(seed=3).fail("a", times=2)
    assert [bool(plan.decide("a", 1, attempt)) for attempt in (1, 2, 3)] == [True, True, False]
    assert plan.decide("b", 1, 1) == []
    assert FaultPlan().fail("a", prob=0.0).decide("a", 1, 1) == []
    assert FaultPlan().fail("*", prob=1.0).decide("b", 9, 9) != []
    half = FaultPlan(seed=11).fail("a", prob=0.5)
    hits = sum(bool(half.decide("a", job, attempt)) for job in range(1, 501) for attempt in (1, 2, 3, 4))
    assert 900 < hits < 1100  # 2000 independent draws at p = 0.5
    other = [bool(FaultPlan(seed=12).fail("a", prob=0.5).decide("a", j, 1)) for j in range(1, 65)]
    assert other != [bool(half.decide("a", j, 1)) for j in range(1, 65)]  # the seed matters


def test_plan_arguments_are_checked() -> None:
    plan = FaultPlan()
    with pytest.raises(ValueError, match="times"):
        plan.fail("a", times=0)
    with pytest.raises(ValueError, match="prob"):
        plan.hang("a", prob=1.5)
    with pytest.raises(ValueError, match="when"):
        plan.fail("a", when="during")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seconds"):
        plan.delay("a", -1)
    with pytest.raises(ValueError, match="task"):
        plan.fail("")
    with pytest.raises(ValueError, match="error"):
        plan.fail("a", error=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="after_records"):
        plan.crash(after_records=0)
    with pytest.raises(ValueError, match="seed"):
        FaultPlan(seed="x")  # type: ignore[arg-type]
    assert plan.rules == ()
    with pytest.raises(ValueError, match="n >= 1"):
        crash_points(0)
    assert crash_points(3) == [1, 2, 3]


def test_repr_and_clear_keep_the_record() -> None:
    plan = FaultPlan(seed=5).fail("a", times=1).delay("b", 0.5, prob=0.25).crash(after_records=3)
    assert repr(plan) == (
        "<FaultPlan seed=5 [fail('a', when='before', times=1), delay('b', 0.5, prob=0.25), crash(after_records=3)]>"
    )
    plan.injected.append(trioq.testing.Injection("crash", record=3))
    plan.clear()
    assert plan.rules == () and plan.crash_after is None
    assert [str(i) for i in plan.injected] == ["crash after log record 3"]


# ------------------------------------------------------------ in a queue


async def test_fail_before_skips_the_handler_and_retries(autojump_clock: trio.testing.MockClock) -> None:
    plan = FaultPlan().fail("pay", times=2, error=ConnectionError("gateway down"))
    async with trioq.open_queue(registry, faults=plan) as queue:
        job = await queue.enqueue("pay", {"n": 1})
        done = await queue.wait(job.id)
    assert (done.state, done.attempts, done.result) == ("succeeded", 3, 1)
    assert calls == [("pay", 1)]  # the handler ran once: the two failures came before it
    assert [str(i) for i in plan.injected] == [
        "fail before the handler: task 'pay', job 1, attempt 1 (ConnectionError: gateway down)",
        "fail before the handler: task 'pay', job 1, attempt 2 (ConnectionError: gateway down)",
    ]
    assert plan.injected[0].job_id == job.id


async def test_fail_after_runs_the_handler_then_loses_its_result(autojump_clock: trio.testing.MockClock) -> None:
    plan = FaultPlan().fail("pay", times=1, when="after")
    async with trioq.open_queue(registry, faults=plan) as queue:
        job = await queue.enqueue("pay", {"n": 2})
        done = await queue.wait(job.id)
    assert (done.state, done.attempts) == ("succeeded", 2)
    assert calls == [("pay", 2), ("pay", 2)]
    assert plan.injected[0].error == (
        "InjectedFailure: injected failure after the handler returned: its result was not recorded"
    )


async def test_fail_error_forms_and_exhaustion(autojump_clock: trio.testing.MockClock) -> None:
    plan = FaultPlan().fail("pay", error=KeyError, times=1).fail("unbounded", error="boom")
    async with trioq.open_queue(registry, faults=plan) as queue:
        paid = await queue.enqueue("pay", {"n": 3})
        dead = await queue.enqueue("unbounded", max_attempts=2)
        paid, dead = await queue.wait(paid.id), await queue.wait(dead.id)
    assert paid.state == "succeeded"
    assert dead.state == "dead" and dead.attempts == 2
    assert dead.error == "InjectedFailure: boom"
    assert calls == [("pay", 3)]
    assert issubclass(InjectedFailure, Exception)


async def test_fail_applies_to_thread_handlers(autojump_clock: trio.testing.MockClock) -> None:
    plan = FaultPlan().fail("digest", times=1, when="after")
    async with trioq.open_queue(registry, faults=plan) as queue:
        job = await queue.enqueue("digest", {"n": 4})
        done = await queue.wait(job.id)
    assert (done.state, done.attempts, done.result) == ("succeeded", 2, 8)
    assert calls == [("digest", 4), ("digest", 4)]


@pytest.mark.parametrize("when", ["before", "after"])
async def test_hang_is_caught_by_the_attempt_deadline(autojump_clock: trio.testing.MockClock, when: str) -> None:
    plan = FaultPlan().hang("pay", times=1, when=when)  # type: ignore[arg-type]
    start = trio.current_time()
    async with trioq.open_queue(registry, faults=plan) as queue:
        job = await queue.enqueue("pay", {"n": 5})
        done = await queue.wait(job.id)
        stats = await queue.stats()
    assert (done.state, done.attempts) == ("succeeded", 2)
    assert stats["totals"]["timed_out"] == 1  # pay's timeout=10 stopped the hung attempt
    assert trio.current_time() - start >= 10.0
    assert len(calls) == (1 if when == "before" else 2)
    assert [i.kind for i in plan.injected] == ["hang"]


async def test_hang_into_a_task_without_deadline_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    with pytest.raises(ValueError, match="would hang"):
        async with trioq.open_queue(registry, faults=FaultPlan().hang("unbounded")):
            pass
    with pytest.raises(ValueError, match="'unbounded'"):  # "*" covers every task, unbounded too
        async with trioq.open_queue(registry, faults=FaultPlan().hang("*", times=1)):
            pass
    plan = FaultPlan()
    async with trioq.open_queue(registry, faults=plan) as queue:
        with pytest.raises(ValueError, match="heartbeat_timeout"):
            plan.hang("unbounded", times=1)  # refused at once, while the queue runs
        assert plan.rules == ()
        job = await queue.enqueue("unbounded")
        assert (await queue.wait(job.id)).state == "succeeded"
    # With a queue-wide heartbeat timeout, the same hang is fine.
    plan = FaultPlan().hang("unbounded", times=1)
    async with trioq.open_queue(registry, faults=plan, heartbeat_timeout=3.0) as queue:
        job = await queue.enqueue("unbounded")
        done = await queue.wait(job.id)
        hung = (await queue.stats())["totals"]["hung"]
    assert (done.state, done.attempts, hung) == ("succeeded", 2, 1)


async def test_a_plan_naming_an_unknown_task_is_refused() -> None:
    with pytest.raises(trioq.UnknownTask, match="'py'"):
        async with trioq.open_queue(registry, faults=FaultPlan().fail("py")):
            pass
    with pytest.raises(TypeError, match="FaultPlan"):
        async with trioq.open_queue(registry, faults="fail everything"):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize(("seconds", "attempts"), [(4.0, 1), (12.0, 2)])
async def test_delay_counts_against_the_timeout(
    autojump_clock: trio.testing.MockClock, seconds: float, attempts: int
) -> None:
    plan = FaultPlan().delay("pay", seconds, times=1)
    start = trio.current_time()
    async with trioq.open_queue(registry, faults=plan) as queue:
        job = await queue.enqueue("pay", {"n": 6})
        done = await queue.wait(job.id)
    assert (done.state, done.attempts) == ("succeeded", attempts)
    assert trio.current_time() - start >= min(seconds, 10.0) + 0.5


async def run_probabilistic(
    plan: FaultPlan, *, workers: int, store: trioq.Store | None = None
) -> list[tuple[str, int, int | None]]:
    """Run 30 ``pay`` jobs under ``plan``; returns (kind, payload n, attempt) of each injection."""
    # Priorities make the claim order differ from the enqueue order, and
    # differ between worker counts: jobs are numbered by enqueue order.
    async with trioq.open_queue(registry, faults=plan, workers=workers, store=store) as queue:
        jobs = await queue.enqueue_many([trioq.JobSpec("pay", {"n": n}, priority=n % 3) for n in range(10)])
        for n in range(10, 30):
            jobs.append(await queue.enqueue("pay", {"n": n}, priority=n % 4))
            await trio.sleep(0.1)
        await queue.join()
        await assert_all_terminal(queue)
    payload_n = {job.id: job.payload["n"] for job in jobs}
    assert all(i.job == payload_n[i.job_id] + 1 for i in plan.injected)  # numbered in enqueue order
    return sorted((i.kind, payload_n[i.job_id], i.attempt) for i in plan.injected)


async def test_scheduling_cannot_change_which_attempts_get_faults(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    def plan(seed: int = 42) -> FaultPlan:
        return FaultPlan(seed=seed).fail("pay", prob=0.3).delay("pay", 0.7, prob=0.3).hang("pay", prob=0.1)

    one = await run_probabilistic(plan(), workers=1)
    many = await run_probabilistic(plan(), workers=8)
    durable = await run_probabilistic(plan(), workers=3, store=trioq.WALStore(tmp_path, fsync="always"))
    assert len(one) > 10
    assert one == many == durable
    assert await run_probabilistic(plan(43), workers=1) != one


# ----------------------------------------------------------------- crashes


blocker = trioq.Registry()


@blocker.task
async def block(ctx: trioq.JobContext) -> None:
    await trio.sleep_forever()


@blocker.task
async def quick(ctx: trioq.JobContext) -> None:
    pass


async def test_crash_needs_a_log() -> None:
    with pytest.raises(ValueError, match="WALStore"):
        async with trioq.open_queue(registry, faults=FaultPlan().crash(after_records=1)):
            pass


async def test_crash_comes_out_as_itself_and_writes_nothing_more(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    plan = FaultPlan()
    store = trioq.WALStore(tmp_path, fsync="always")
    with pytest.raises(SimulatedCrash) as caught:
        async with trioq.open_queue(blocker, store=store, workers=1, faults=plan) as queue:
            running = await queue.enqueue("block")  # ADD (1), then the worker's CLAIM (2)
            await trio.sleep(1)
            cancelled = await queue.enqueue("quick")  # ADD (3): flushes the CLAIM with it
            plan.crash(after_records=4)  # armed while running: counts from the open
            with contextlib.suppress(SimulatedCrash):  # swallowing it does not keep a dead queue alive
                await queue.cancel(cancelled.id)  # CANCEL (4): the crash
            await trio.sleep(5)
            pytest.fail("the body ran on after the crash")
    assert type(caught.value) is SimulatedCrash
    assert "record 4" in str(caught.value)
    assert plan.crash_after is None and str(plan.injected[-1]) == "crash after log record 4"
    assert plan.records == 4
    # Nothing was released: the log still says `block` is running, so recovery
    # puts it back to ready, its cut-off attempt uncounted; the CANCEL never landed.
    async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), workers=0) as queue:
        assert queue.store.recovery is not None and queue.store.recovery.records == 3  # type: ignore[attr-defined]
        job = await queue.get(running.id)
        assert (job.state, job.attempts) == ("ready", 0)
        assert (await queue.get(cancelled.id)).state == "ready"


async def test_a_crash_strikes_once_and_the_next_open_recovers(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    plan = FaultPlan().crash(after_records=3)
    acknowledged = []
    with pytest.raises(SimulatedCrash):
        async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), workers=0, faults=plan) as queue:
            for _ in range(3):
                acknowledged.append((await queue.enqueue("quick")).id)
    assert len(acknowledged) == 2
    async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), faults=plan) as queue:
        for job_id in acknowledged:
            assert (await queue.wait(job_id)).state == "succeeded"
    assert [i.kind for i in plan.injected] == ["crash"]
    assert plan.records == 4  # two claims, two successes: the same plan did not crash again


async def test_a_crash_can_strike_while_the_queue_opens(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # A first crash leaves a running job; reopening releases it with record 1.
    with pytest.raises(SimulatedCrash):
        async with trioq.open_queue(
            blocker, store=trioq.WALStore(tmp_path), workers=1, faults=FaultPlan().crash(after_records=3)
        ) as queue:
            await queue.enqueue("block")
            await trio.sleep(1)
            await queue.enqueue("quick")
    entered = False
    with pytest.raises(SimulatedCrash, match="record 1 "):
        async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), faults=FaultPlan().crash(after_records=1)):
            entered = True
    assert not entered


@pytest.mark.parametrize(("fsync", "kept"), [("always", True), ("interval", True), ("never", False)])
async def test_a_crash_drops_what_the_log_never_synced(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, fsync: str, kept: bool
) -> None:
    acknowledged = []
    with pytest.raises(SimulatedCrash):
        async with trioq.open_queue(
            blocker, store=trioq.WALStore(tmp_path, fsync=fsync), workers=0, faults=FaultPlan().crash(after_records=6)
        ) as queue:
            for _ in range(10):
                acknowledged.append((await queue.enqueue("quick")).id)
                await trio.sleep(0.01)  # lets "interval" sync
    assert len(acknowledged) == 5
    segments = sorted(name for name in os.listdir(tmp_path) if name.endswith(".wal"))
    assert bool(segments) == kept  # "never" synced not even the segment header
    async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), workers=0) as queue:
        counts = await queue.store.counts()
    assert counts["ready"] == (5 if kept else 0)


# ---------------------------------------------------------------- helpers


async def test_assert_all_terminal_lists_what_is_pending(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(blocker, workers=0) as queue:
        await assert_all_terminal(queue)  # nothing at all is fine
        jobs = [await queue.enqueue("quick") for _ in range(3)]
        later = await queue.enqueue("quick", delay=60)
        await queue.cancel(jobs[0].id)
        with pytest.raises(AssertionError) as caught:
            await assert_all_terminal(queue, show=2)
        message = str(caught.value)
        assert message.splitlines()[0] == "not every job is terminal: 2 ready, 1 scheduled"
        assert f"{jobs[1].id} 'quick' ready, 0 attempt(s)" in message
        assert later.id not in message and "... and 1 more" in message


async def test_a_failing_body_is_not_hidden_by_a_crash_during_shutdown(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # ADD (1), CLAIM (2); the release at shutdown would be record 3.
    plan = FaultPlan().crash(after_records=3)
    with pytest.raises(AssertionError, match="the test's own check"):
        async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), faults=plan) as queue:
            await queue.enqueue("block")
            await trio.sleep(1)
            raise AssertionError("the test's own check")
    assert plan.injected == [] and plan.crash_after == 3  # disarmed, not spent


async def test_a_claimed_job_waits_only_for_enqueues_already_in_flight() -> None:
    from trioq._testing.faults import FaultSession

    session = FaultSession(
        FaultPlan(), registry=registry, heartbeat_timeout=None, store=trioq.MemoryStore(), on_crash=print
    )
    first = session.enqueue_started()
    got: list[int] = []
    async with trio.open_nursery() as nursery:
        # Claimed while `first` (which added it) is in flight: waits for it.
        nursery.start_soon(lambda: _number_into(session, "job-a", got))
        await trio.testing.wait_all_tasks_blocked()
        later = session.enqueue_started()  # began after the claim: not waited for
        session.enqueue_finished(first, [SimpleNamespace(id="job-a")])  # type: ignore[list-item]
        await trio.testing.wait_all_tasks_blocked()
        assert got == [1]  # while `later` is still in flight
        session.enqueue_finished(later, [])
        assert await session.number("recovered") == 2  # nobody enqueued it: numbered now
    session.close()


async def _number_into(session: Any, job_id: str, into: list[int]) -> None:
    into.append(await session.number(job_id))


async def test_interval_writer_syncs_nothing_after_the_crash(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    plan = FaultPlan().crash(after_records=3)
    with pytest.raises(SimulatedCrash):
        async with trioq.open_queue(
            blocker, store=trioq.WALStore(tmp_path, fsync="interval"), workers=0, faults=plan
        ) as queue:
            await queue.enqueue("quick")  # record 1: the first commit syncs at once
            await queue.enqueue("quick")  # record 2: written, not synced yet (< 5 ms later)
            await queue.enqueue("quick")  # record 3: the crash
    async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), workers=0) as queue:
        assert (await queue.store.counts())["ready"] == 1  # the unsynced second record is gone


async def test_records_waiting_for_their_commit_are_lost_with_the_one_that_crashed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    plan = FaultPlan().crash(after_records=4)
    with pytest.raises(SimulatedCrash):
        async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), workers=0, faults=plan) as queue:
            await queue.enqueue("quick")  # record 1: committed
            # Three ADDs appended in one step: the third crashes before any commit.
            await queue.enqueue_many([trioq.JobSpec("quick")] * 3)
    assert plan.records == 4
    async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), workers=0) as queue:
        assert queue.store.recovery is not None and queue.store.recovery.records == 1  # type: ignore[attr-defined]


async def test_the_plan_wraps_the_log_only_while_it_is_applied(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    from trioq._testing.crashlog import CrashLog
    from trioq.stores.wal._writer import LogWriter

    store = trioq.WALStore(tmp_path)
    with pytest.raises(trioq.UnknownTask):  # a plan refused leaves the store as it was
        async with trioq.open_queue(blocker, store=store, faults=FaultPlan().fail("nope")):
            pass  # pragma: no cover
    assert "_open_log" not in vars(store)
    plan = FaultPlan()
    async with trioq.open_queue(blocker, store=store, workers=0, faults=plan) as queue:
        assert isinstance(store._writer, CrashLog) and type(store._writer.log) is LogWriter
        await queue.enqueue("quick")
    assert plan.records == 1 and "_open_log" not in vars(store)
    async with trioq.open_queue(blocker, store=store, workers=0):
        assert type(store._writer) is LogWriter  # the store's own writer, nothing counted


async def test_a_cancelled_log_writer_changes_no_file(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # What the crash relies on: cancelled, the writer stops before its next
    # write; records it had not committed are lost, their waiters told.
    from trioq.stores.wal._writer import LogWriter

    writer = LogWriter(
        str(tmp_path), fsync="always", segment_size=1 << 20, next_segment=1, old_segments=[], export=list, live=int
    )
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await writer.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        writer.append(b"committed")
        await writer.flush()
        ((path, _),) = writer.segments.values()
        before = Path(path).read_bytes()  # records, then the zeros padded ahead
        writer.append(b"lost")  # wakes the writer for a commit...
        scope.cancel()  # ...that the cancel stops in its scheduling pass
        with pytest.raises(RuntimeError, match="stopped before these records were committed"):
            await writer.flush()
    assert Path(path).read_bytes() == before  # not written, the padding not trimmed
    with pytest.raises(RuntimeError, match="closed"):
        writer.append(b"later")


async def test_a_checkpoint_is_durable_even_with_fsync_never(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # A checkpoint deletes the segments it replaces: it must reach the disk
    # first, or a crash right after it would lose jobs that were safe before.
    async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path, fsync="never"), workers=0) as queue:
        for _ in range(3):
            await queue.enqueue("quick")
    store = trioq.WALStore(tmp_path, fsync="never")
    with pytest.raises(SimulatedCrash):
        async with trioq.open_queue(blocker, store=store, workers=0, faults=FaultPlan().crash(after_records=1)) as q:
            await store.checkpoint()
            await q.enqueue("quick")
    async with trioq.open_queue(blocker, store=trioq.WALStore(tmp_path), workers=0) as queue:
        assert (await queue.store.counts())["ready"] == 3


class GatewayError(Exception):
    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


async def test_error_instances_that_copy_cannot_rebuild_are_raised_as_given(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = FaultPlan().fail("unbounded", error=GatewayError("502 from gateway", status=502))
    async with trioq.open_queue(registry, faults=plan) as queue:
        job = await queue.enqueue("unbounded", max_attempts=1)
        done = await queue.wait(job.id)
    assert done.error == "GatewayError: 502 from gateway"
    assert plan.injected[0].error == "GatewayError: 502 from gateway"
    with pytest.raises(ValueError, match="pass an instance"):
        FaultPlan().fail("unbounded", error=GatewayError)


def test_a_refused_rule_takes_no_number() -> None:
    from trioq._testing.faults import FaultSession

    plan = FaultPlan(seed=9)
    session = FaultSession(plan, registry=registry, heartbeat_timeout=None, store=trioq.MemoryStore(), on_crash=print)
    with pytest.raises(trioq.UnknownTask):
        plan.fail("nope")  # refused while attached to a queue
    plan.fail("pay", prob=0.5)
    session.close()
    # Numbered as if the refused rule had never been asked for: the same draws.
    assert plan.rules == FaultPlan(seed=9).fail("pay", prob=0.5).rules


async def test_a_job_cancelled_while_its_worker_waits_for_its_number_never_runs(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Between its claim and its attempt a worker can wait (for the numbering of
    # a fault plan, for a CPU): a cancel landing there must stop the job too.
    from trioq._testing.faults import FaultSession

    real_number = FaultSession.number

    async def slow_number(self: FaultSession, job_id: str) -> int:
        await trio.sleep(1.0)
        return await real_number(self, job_id)

    monkeypatch.setattr(FaultSession, "number", slow_number)
    ran: list[int] = []
    registry = trioq.Registry()

    @registry.task
    async def record(ctx: trioq.JobContext) -> None:
        ran.append(1)

    async with trioq.open_queue(registry, workers=1, faults=FaultPlan()) as queue:
        job = await queue.enqueue("record")
        await trio.sleep(0.5)  # claimed; its worker is waiting for the number
        assert (await queue.get(job.id)).state is trioq.JobState.RUNNING
        assert (await queue.cancel(job.id)).state is trioq.JobState.CANCELLED
        await queue.join()
        assert (await queue.get(job.id)).state is trioq.JobState.CANCELLED
    assert ran == []


async def test_the_plan_wraps_add_claim_and_the_handler_call_only_while_it_is_applied(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Faults reach a queue by wrapping (the store's add and claim, the executor's invoke), never by
    a branch in production code: without a plan, nothing of the plan's is in place."""
    store = trioq.MemoryStore()
    plan = FaultPlan(seed=1).fail("quick", times=1)
    async with trioq.open_queue(blocker, store=store, workers=1, faults=plan) as queue:
        executor = queue._pool.pools[0].executor
        assert {"add", "claim"} <= set(vars(store)) and "invoke" in vars(executor)
        job = await queue.wait((await queue.enqueue("quick")).id)
    assert job.attempts == 2 and [i.kind for i in plan.injected] == ["fail"]
    assert not {"add", "claim", "_open_log"} & set(vars(store)) and "invoke" not in vars(executor)
    async with trioq.open_queue(blocker, store=store, workers=1) as queue:
        assert "invoke" not in vars(queue._pool.pools[0].executor)
        assert (await queue.wait((await queue.enqueue("quick")).id)).attempts == 1
