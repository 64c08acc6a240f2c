"""Cron ticks: ``add_tick`` enqueues one job per tick, however often (and by however many nodes) it is asked."""

from __future__ import annotations

import random
from typing import ClassVar

import trio

from ..._model import InvalidJob, JobState
from .._base import NewJob, Store
from ._fixtures import CaseBase, needs
from ._harness import START, Harness

__all__ = ["CronCases"]


def _key(name: str, tick: float) -> str:
    return f"cron:{name}:{tick:.0f}"


def _job(harness: Harness, name: str, tick: float) -> NewJob:
    return harness.job("cron-task", {"tick": tick}, key=_key(name, tick))


class CronCases(CaseBase):
    """``Store.add_tick`` and ``Store.ticks``: the marks of cron schedules and the jobs of their ticks."""

    #: Steps of the model-based run of ticks (random ticks, repeats, reopens), and its runs.
    cron_model_steps: ClassVar[int] = 40
    cron_model_runs: ClassVar[int] = 3

    async def test_cron_each_tick_enqueues_one_job(self, harness: Harness, store: Store) -> None:
        """A tick past the mark enqueues its job (ready, with its key) and moves the mark; each new tick again."""
        assert await store.ticks() == {}
        first = await store.add_tick("every5", START + 300, _job(harness, "every5", START + 300))
        assert first is not None and first.state is JobState.READY and first.key == _key("every5", START + 300)
        second = await store.add_tick("every5", START + 600, _job(harness, "every5", START + 600))
        assert second is not None and second.id != first.id
        assert await store.ticks() == {"every5": START + 600}
        held = await store.jobs([JobState.READY])
        assert sorted(j.id for j in held) == sorted([first.id, second.id])

    async def test_cron_a_repeated_or_older_tick_enqueues_nothing(self, harness: Harness, store: Store) -> None:
        """The same tick again, or one before the mark, returns ``None`` and changes nothing."""
        tick = START + 300
        assert await store.add_tick("c", tick, _job(harness, "c", tick)) is not None
        assert await store.add_tick("c", tick, _job(harness, "c", tick)) is None
        assert await store.add_tick("c", tick - 300, _job(harness, "c", tick - 300)) is None
        assert await store.ticks() == {"c": tick}
        assert (await store.counts())["ready"] == 1

    async def test_cron_schedules_keep_marks_of_their_own(self, harness: Harness, store: Store) -> None:
        """Each name has its own mark: one schedule's tick does not take another's."""
        tick = START + 60
        assert await store.add_tick("a", tick, _job(harness, "a", tick)) is not None
        assert await store.add_tick("b", tick, _job(harness, "b", tick)) is not None
        assert await store.ticks() == {"a": tick, "b": tick}

    async def test_cron_a_baseline_is_recorded_once_and_enqueues_nothing(self, harness: Harness, store: Store) -> None:
        """``job=None`` records the mark only where there is none; it never moves an existing mark."""
        assert await store.add_tick("c", START, None) is None
        assert await store.ticks() == {"c": START}
        assert await store.add_tick("c", START + 100, None) is None
        assert await store.ticks() == {"c": START}
        assert await store.add_tick("c", START - 1, _job(harness, "c", START - 1)) is None  # before the baseline
        assert await store.add_tick("c", START + 300, _job(harness, "c", START + 300)) is not None
        assert await store.ticks() == {"c": START + 300}
        assert (await store.counts())["ready"] == 1

    async def test_cron_a_tick_whose_key_is_held_counts_as_taken(self, harness: Harness, store: Store) -> None:
        """A job holding the tick's key already: ``None``, no second job, and the mark moves on."""
        tick = START + 300
        (held,) = await store.add([_job(harness, "c", tick)])
        assert await store.add_tick("c", tick, _job(harness, "c", tick)) is None
        assert await store.ticks() == {"c": tick}
        assert [j.id for j in await store.jobs([JobState.READY])] == [held.id]

    async def test_cron_a_bad_tick_records_nothing(self, harness: Harness, store: Store) -> None:
        """A name that is no label, a tick that is no finite number, a job the store cannot hold: ``InvalidJob``,
        and no mark."""
        job = _job(harness, "c", START)
        for name, tick in (("", START), ("c", float("nan")), ("c", float("inf"))):
            try:
                await store.add_tick(name, tick, job)
            except InvalidJob:
                pass
            else:
                raise AssertionError(f"add_tick({name!r}, {tick!r}) was accepted")
        unstorable = harness.job("cron-task", {"big": 2**70}, key=_key("c", START))
        try:
            await store.add_tick("c", START, unstorable)
        except InvalidJob:
            pass
        else:
            raise AssertionError("a payload the store cannot hold was accepted")
        assert await store.ticks() == {}
        assert sum((await store.counts()).values()) == 0

    async def test_cron_ticks_survive_a_reopen(self, harness: Harness) -> None:
        """Marks are kept like jobs: a new session (a restart) finds them, and the tick's job, as they were."""
        store = harness.make()
        tick = START + 300
        async with harness.session(store):
            job = await store.add_tick("c", tick, _job(harness, "c", tick))
            assert job is not None
            await store.add_tick("base", START, None)
        again = harness.reopen(store)
        async with harness.session(again):
            assert await again.ticks() == {"c": tick, "base": START}
            assert (await again.get(job.id)).key == _key("c", tick)
            assert await again.add_tick("c", tick, _job(harness, "c", tick)) is None

    @needs("checkpoint")
    async def test_cron_ticks_survive_a_checkpoint(self, harness: Harness) -> None:
        """A checkpoint carries the marks (the log before it is gone): a reopen after it still has them."""
        store = harness.make()
        async with harness.session(store):
            await store.add_tick("c", START + 300, _job(harness, "c", START + 300))
            await harness.checkpoint(store)
            await store.add_tick("d", START + 60, _job(harness, "d", START + 60))
            await harness.checkpoint(store)
        again = harness.reopen(store)
        async with harness.session(again):
            assert await again.ticks() == {"c": START + 300, "d": START + 60}

    @needs("concurrent_sessions")
    async def test_cron_nodes_racing_for_a_tick_enqueue_it_once(self, harness: Harness) -> None:
        """Two nodes asking for the same tick at once (or a new leader asking again): one job."""
        first = harness.make()
        second = harness.reopen(first)
        async with harness.session(first), harness.session(second, node="node-b"):
            for round_ in range(5):
                tick = START + 300 * (round_ + 1)
                got: list[object] = []

                async def take(store: Store, tick: float = tick, got: list[object] = got) -> None:
                    got.append(await store.add_tick("race", tick, _job(harness, "race", tick)))

                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(take, first)
                        nursery.start_soon(take, second)
                assert sum(1 for job in got if job is not None) == 1, got
            assert (await second.ticks())["race"] == START + 1500
            assert (await first.counts())["ready"] == 5

    async def test_cron_model_based_run_of_ticks(self, harness: Harness) -> None:
        """Random ticks (new, repeated, older), baselines, reopens and checkpoints agree with a plain model: a
        tick enqueues one job exactly when it is past the name's mark, and the marks are the model's."""
        for run in range(self.cron_model_runs):
            rng = random.Random(run)
            model: dict[str, float] = {}
            jobs: dict[str, str] = {}  # key -> job id
            store = harness.make()
            for _ in range(3):  # sessions, each a reopen of the last
                async with harness.session(store):
                    assert await store.ticks() == model
                    for _ in range(self.cron_model_steps // 3):
                        name = rng.choice(("a", "b", "c"))
                        tick = START + 60 * rng.randrange(0, 12)
                        if rng.random() < 0.15:
                            await store.add_tick(name, tick, None)
                            model.setdefault(name, tick)
                        elif rng.random() < 0.05:
                            await harness.checkpoint(store)
                        else:
                            got = await store.add_tick(name, tick, _job(harness, name, tick))
                            key = _key(name, tick)
                            fresh = (name not in model or model[name] < tick) and key not in jobs
                            if name not in model or model[name] < tick:
                                model[name] = tick
                            assert (got is not None) == fresh, (name, tick, model)
                            if got is not None:
                                jobs[key] = got.id
                        assert await store.ticks() == model
                    for key, job_id in jobs.items():
                        assert (await store.get(job_id)).key == key
                store = harness.reopen(store)
            harness.path = harness.path / f"run{run}"
