"""Cases for limit keys: a job runs only while every key it holds has a free slot and a token."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
import trio

from ..._model import RATE_SLACK, Job, JobState
from .._base import Failed, Outcome, Released, Snoozed, Succeeded
from ._fixtures import CaseBase, needs
from ._harness import START, Harness, StoreKind, claim_one, complete_one

__all__ = ["LimitInvariantCases", "LimitKeyCases"]


class LimitKeyCases(CaseBase):
    """``max`` slots and ``rate`` tokens per key (``StoreConfig.limits``); passed-over jobs are not waited for."""

    async def test_a_full_key_passes_its_jobs_over_and_others_run(self, harness: Harness) -> None:
        """With ``max=1`` held, the key's next job is skipped and the free job behind it is claimed."""
        harness.limit("gateway", max=1)
        async with harness.session(harness.make()) as store:
            first, second, free = await store.add(
                [harness.job(limits=["gateway"]), harness.job(limits=["gateway"]), harness.job()]
            )
            assert first.limits == ("gateway",) and free.limits == ()
            claimed = await store.claim(harness.request(3))
            assert [job.id for job in claimed] == [first.id, free.id]
            assert (await store.get(second.id)).state is JobState.READY
            assert await store.claim(harness.request(3)) == []

    async def test_a_slot_freed_by_an_outcome_lets_the_next_job_run(self, harness: Harness) -> None:
        """Each way an attempt ends (success, failure, release, snooze, cancel) frees its slot; a stale
        outcome frees nothing."""
        harness.limit("k", max=1)
        async with harness.session(harness.make()) as store:
            jobs = await store.add([harness.job(limits=["k"], max_attempts=9) for _ in range(6)])
            endings: list[Outcome | str] = [
                Succeeded("", 0, None),
                Failed("", 0, "E: x", 100.0),
                Released("", 0),
                Snoozed("", 0, 100.0),
                "cancel",
            ]
            running = await claim_one(store)
            for end in endings:
                assert await store.claim(harness.request(5)) == []
                assert await complete_one(store, Succeeded(running.id, running.epoch - 1, "stale")) is None
                assert await store.claim(harness.request(5)) == []
                harness.hints.clear()
                if isinstance(end, str):
                    await store.cancel(running.id)
                else:
                    await store.complete([msgspec.structs.replace(end, job_id=running.id, epoch=running.epoch)])
                if harness.kind.inline_hints:
                    assert sum(harness.hints.ready) >= 1  # the passed-over job is claimable again
                claimed = await store.claim(harness.request(5))
                assert len(claimed) == 1, f"after {end}: {claimed}"
                running = claimed[0]
            assert {job.id for job in jobs} >= {running.id}

    async def test_max_counts_every_attempt_holding_the_key(self, harness: Harness) -> None:
        """``max=3``: a claim of ten takes three; one more once one of them ends."""
        harness.limit("db", max=3)
        async with harness.session(harness.make()) as store:
            await store.add([harness.job(limits=["db"]) for _ in range(5)])
            claimed = await store.claim(harness.request(10))
            assert len(claimed) == 3
            assert await store.claim(harness.request(10)) == []
            done = Succeeded(claimed[0].id, claimed[0].epoch, None)
            assert await complete_one(store, done) is JobState.SUCCEEDED
            assert len(await store.claim(harness.request(10))) == 1
            assert await store.claim(harness.request(10)) == []

    async def test_a_slot_is_passed_on_when_the_job_let_go_for_it_never_takes_it(self, harness: Harness) -> None:
        """A freed slot goes to the next job in line; if that job leaves unclaimed (its deadline, a cancel),
        the slot goes to the one behind it, not to nobody (no job waits on a free key)."""
        harness.limit("A", max=1)
        async with harness.session(harness.make()) as store:
            holder, expiring, cancelled, last = await store.add(
                [
                    harness.job(limits=["A"]),
                    harness.job(limits=["A"], deadline=1.5),
                    harness.job(limits=["A"]),
                    harness.job(limits=["A"]),
                ]
            )
            (running,) = await store.claim(harness.request(5))
            assert running.id == holder.id
            assert await store.claim(harness.request(5)) == []  # the three others passed over
            harness.clock.advance(1.0)
            assert await complete_one(store, Succeeded(running.id, running.epoch, None)) is JobState.SUCCEEDED
            harness.clock.advance(0.5)
            await store.promote()  # the job let go for the slot expires before anyone claims it
            assert (await store.get(expiring.id)).state is JobState.CANCELLED
            await store.cancel(cancelled.id)  # and the next one is cancelled
            claimed = await store.claim(harness.request(5))
            assert [job.id for job in claimed] == [last.id]

    async def test_a_slot_passes_over_a_job_held_by_another_key_or_a_paused_queue(self, harness: Harness) -> None:
        """The job let go for a freed slot that another full key turns back passes the slot on; a job of a
        paused queue is not let go for one. (A store may need a second claim to see the job come back.)"""
        harness.limit("k1", max=1)
        harness.limit("k2", max=1)
        async with harness.session(harness.make()) as store:
            first, other, both, paused, last = await store.add(
                [
                    harness.job(limits=["k1"]),
                    harness.job(limits=["k2"]),
                    harness.job(limits=["k1", "k2"]),
                    harness.job(limits=["k1"], queue="p"),
                    harness.job(limits=["k1"]),
                ]
            )
            assert [job.id for job in await store.claim(harness.request(5))] == [first.id, other.id]
            await store.pause("p")
            running = {job.id: job for job in await store.claim(harness.request(5))}
            assert running == {}
            assert await complete_one(store, Succeeded(first.id, 1, None)) is JobState.SUCCEEDED

            async def claim_twice() -> list[str]:
                claimed = await store.claim(harness.request(5))
                return [job.id for job in claimed or await store.claim(harness.request(5))]

            assert await claim_twice() == [last.id]  # not `both` (k2 is full), not `paused`
            assert (await store.get(paused.id)).state is JobState.READY
            assert (await store.get(both.id)).state is JobState.READY

    async def test_each_key_a_pattern_matches_has_its_own_limit(self, harness: Harness) -> None:
        """``user:*`` with ``max=1`` is a mutex per user; a job holding two keys needs both."""
        harness.limit("user:*", max=1)
        harness.limit("shared", max=2)
        async with harness.session(harness.make()) as store:
            a1, a2, b1, both = await store.add(
                [
                    harness.job(limits=["user:a"]),
                    harness.job(limits=["user:a"]),
                    harness.job(limits=["user:b", "shared"]),
                    harness.job(limits=["user:c", "user:a"]),
                ]
            )
            claimed = await store.claim(harness.request(10))
            assert [job.id for job in claimed] == [a1.id, b1.id]
            assert (await store.get(a2.id)).state is JobState.READY
            assert (await store.get(both.id)).state is JobState.READY
            assert await complete_one(store, Succeeded(a1.id, claimed[0].epoch, None)) is JobState.SUCCEEDED
            assert [job.id for job in await store.claim(harness.request(10))] == [a2.id]

    async def test_a_key_with_no_limit_bounds_nothing(self, harness: Harness) -> None:
        async with harness.session(harness.make()) as store:
            await store.add([harness.job(limits=["undeclared"]) for _ in range(3)])
            assert len(await store.claim(harness.request(10))) == 3

    async def test_a_rate_starts_a_burst_then_one_per_interval(self, harness: Harness) -> None:
        """``rate=2, per=1, burst=2``: two start at once, then one every 0.5 s; ``promote`` says when."""
        harness.limit("api", rate=2.0, per=1.0, burst=2)
        async with harness.session(harness.make()) as store:
            jobs = await store.add([harness.job(limits=["api"]) for _ in range(5)])
            assert [job.id for job in await store.claim(harness.request(10))] == [jobs[0].id, jobs[1].id]
            assert await store.claim(harness.request(10)) == []
            assert await store.promote() == START + 0.5  # when the passed-over job's token is due
            harness.clock.advance(0.25)
            assert await store.claim(harness.request(10)) == []
            harness.clock.advance(0.25)
            harness.hints.clear()
            await store.promote()
            if harness.kind.inline_hints:
                assert sum(harness.hints.ready) >= 1
            assert [job.id for job in await store.claim(harness.request(10))] == [jobs[2].id]
            harness.clock.advance(0.5)
            assert [job.id for job in await store.claim(harness.request(10))] == [jobs[3].id]
            assert await store.claim(harness.request(10)) == []

    async def test_a_rate_limited_backlog_runs_at_the_rate(self, harness: Harness) -> None:
        """Claiming whenever ``promote`` says a token is due starts one job per interval: never more,
        and never later (the backlog runs at the rate, not below it)."""
        harness.limit("api", rate=4.0)
        async with harness.session(harness.make()) as store:
            await store.add([harness.job(limits=["api"]) for _ in range(8)])
            starts: list[float] = []
            for _ in range(8):
                (job,) = await store.claim(harness.request(10))
                starts.append(harness.clock.now)
                assert await store.claim(harness.request(10)) == []
                await store.complete([Succeeded(job.id, job.epoch, None)])
                due = await store.promote()
                if due is not None:
                    harness.clock.now = max(harness.clock.now, due)
                    await store.promote()
            assert await store.promote() is None
            gaps = [b - a for a, b in itertools.pairwise(starts)]
            assert all(abs(gap - 0.25) < 1e-6 for gap in gaps), gaps

    async def test_slots_of_a_closed_session_are_free_after_a_reopen(self, harness: Harness) -> None:
        """A slot is tied to its attempt: a session that ends releases its running jobs and their slots."""
        harness.limit("k", max=1)
        first = harness.make()
        async with harness.session(first) as store:
            held, waiting = await store.add([harness.job(limits=["k"]), harness.job(limits=["k"])])
            await claim_one(store)
        async with harness.session(harness.reopen(first)) as store:
            claimed = await store.claim(harness.request(5))
            assert [job.id for job in claimed] == [held.id]
            assert (await store.get(waiting.id)).state is JobState.READY

    async def test_a_rate_holds_across_a_reopen(self, harness: Harness) -> None:
        """The tokens taken before a reopen (and a checkpoint) still count after it."""
        harness.limit("api", rate=1.0)
        first = harness.make()
        async with harness.session(first) as store:
            await store.add([harness.job(limits=["api"]) for _ in range(3)])
            job = await claim_one(store)
            await complete_one(store, Succeeded(job.id, job.epoch, None))
            await harness.checkpoint(store)
        harness.clock.advance(0.5)
        async with harness.session(harness.reopen(first)) as store:
            assert await store.claim(harness.request(5)) == []
            harness.clock.advance(0.5)
            await store.promote()
            assert len(await store.claim(harness.request(5))) == 1

    @needs("inline_hints")
    async def test_a_passed_over_job_is_hinted_when_its_token_is_due(self, harness: Harness) -> None:
        """The store tells the timer when a rate lets the passed-over job go (``on_scheduled``)."""
        harness.limit("api", rate=1.0)
        async with harness.session(harness.make()) as store:
            await store.add([harness.job(limits=["api"]), harness.job(limits=["api"])])
            harness.hints.clear()
            assert len(await store.claim(harness.request(5))) == 1
            assert harness.hints.scheduled == [START + 1.0]


#: The limits of the random run: a max, a rate, a pattern mutex, and both at once.
_RUN_LIMITS: dict[str, dict[str, Any]] = {
    "a": {"max": 2},
    "b": {"rate": 2.0, "per": 1.0, "burst": 2},
    "u:*": {"max": 1},
    "c": {"max": 1, "rate": 4.0},
}
_RUN_KEYS = ("a", "b", "b", "u:1", "u:2", "c")  # "b" twice: its rate is the easiest to break
_ENDINGS = ("succeed", "fail", "release", "snooze", "cancel")


class LimitInvariantCases(CaseBase):
    """Invariant 8, checked by an independent recorder over random work (hypothesis)."""

    #: Random programs per run, and the most steps in one.
    limit_examples: ClassVar[int] = 60
    limit_steps: ClassVar[int] = 40

    async def test_limits_hold_under_random_work(self, store_kind: StoreKind, tmp_path: Path) -> None:
        """Random adds (with random keys), claims, outcomes of every kind, clock moves, promotes and
        session reopens: at no instant do more attempts hold a key than its ``max``, and in no window
        ``w`` do more than ``burst + rate * w / per`` start under it. The recorder keeps its own list
        of attempts (claimed until their outcome, or until the session closed), not the store's."""
        pytest.importorskip("hypothesis")
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        add = st.tuples(
            st.just("add"), st.lists(st.sampled_from(_RUN_KEYS), max_size=2, unique=True), st.integers(1, 4)
        )
        claim = st.tuples(st.just("claim"), st.integers(1, 4))
        op = st.one_of(
            add,
            add,  # adds and claims twice as likely: limits are reached, not only approached
            claim,
            claim,
            st.tuples(st.just("end"), st.integers(0, 7), st.sampled_from(_ENDINGS)),
            st.tuples(st.just("advance"), st.sampled_from((0.0, 0.05, 0.1, 0.1, 0.25, 0.5, 1.0))),
            st.tuples(st.just("promote")),
            st.tuples(st.just("reopen")),
        )
        examples = iter(range(10**9))

        @settings(
            max_examples=self.limit_examples,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(st.lists(op, min_size=self.limit_steps // 2, max_size=self.limit_steps))
        def check(program: list[tuple[Any, ...]]) -> None:
            path = tmp_path / f"example-{next(examples)}"
            path.mkdir()
            trio.run(_run_program, Harness(store_kind, path), program)

        await trio.to_thread.run_sync(check)


async def _run_program(harness: Harness, program: list[tuple[Any, ...]]) -> None:
    for key, bounds in _RUN_LIMITS.items():
        harness.limit(key, **bounds)
    running: list[Job] = []  # the recorder's: claimed, no outcome yet
    holding: dict[str, int] = {}
    starts: dict[str, list[float]] = {}
    store_obj = harness.make()

    def started(job: Job) -> None:
        running.append(job)
        for key in job.limits:
            holding[key] = holding.get(key, 0) + 1
            starts.setdefault(key, []).append(harness.clock.now)

    def ended(job: Job) -> None:
        running.remove(job)
        for key in job.limits:
            holding[key] -= 1

    def check() -> None:
        for key, held in holding.items():
            limit = harness.limit_of(key)
            assert limit is not None
            assert limit.max is None or held <= limit.max, f"{held} attempts hold {key!r} (max {limit.max})"
        for key, times in starts.items():
            limit = harness.limit_of(key)
            assert limit is not None
            if limit.rate is None:
                continue
            burst = 1 if limit.burst is None else limit.burst
            for i, first in enumerate(times):
                for j in range(i + 1, len(times)):
                    window = times[j] - first
                    allowed = burst + limit.rate * (window + RATE_SLACK) / limit.per + 1e-9
                    assert j - i + 1 <= allowed, f"{j - i + 1} starts of {key!r} in {window:.3f} s: {times}"

    while True:
        async with harness.session(store_obj) as store:
            reopen = False
            for step in program:
                program = program[1:]
                kind = step[0]
                if kind == "add":
                    await store.add([harness.job(limits=step[1], max_attempts=3) for _ in range(step[2])])
                elif kind == "claim":
                    for job in await store.claim(harness.request(step[1])):
                        started(job)
                elif kind == "end" and running:
                    job = running[step[1] % len(running)]
                    how = step[2]
                    if how == "cancel":
                        await store.cancel(job.id)
                    else:
                        outcomes: dict[str, Outcome] = {
                            "succeed": Succeeded(job.id, job.epoch, None),
                            "fail": Failed(job.id, job.epoch, "E: x", 0.1),
                            "release": Released(job.id, job.epoch),
                            "snooze": Snoozed(job.id, job.epoch, 0.1),
                        }
                        outcome = outcomes[how]
                        await store.complete([outcome])
                    ended(job)
                elif kind == "advance":
                    harness.clock.advance(step[1])
                elif kind == "promote":
                    await store.promote()
                elif kind == "reopen":
                    reopen = True
                    break
                check()
        for job in list(running):  # the closed session released them
            ended(job)
        if not reopen:
            return
        store_obj = harness.reopen(store_obj)
