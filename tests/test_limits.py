"""Limit keys through the public API: declared on the registry, named by tasks and enqueues, held by attempts."""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
import trio.testing

import trioq
from trioq import JobSpec, JobState


def _tracked(registry: trioq.Registry, **task: Any) -> tuple[dict[str, int], list[tuple[float, str]]]:
    """Register ``work`` (sleeps ``seconds``), recording the peak of attempts per key and each start."""
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    starts: list[tuple[float, str]] = []

    @registry.task(**task)
    async def work(ctx: trioq.JobContext, seconds: float = 1.0, user: str = "-") -> None:
        for key in ctx.job.limits:
            running[key] = running.get(key, 0) + 1
            peak[key] = max(peak.get(key, 0), running[key])
        starts.append((trio.current_time(), user))
        try:
            await trio.sleep(seconds)
        finally:
            for key in ctx.job.limits:
                running[key] -= 1

    return peak, starts


async def test_a_max_limit_bounds_attempts_while_free_jobs_run(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    registry.limit("gateway", max=2)
    peak, _ = _tracked(registry, limits=["gateway"])

    @registry.task
    async def free(ctx: trioq.JobContext) -> float:
        return trio.current_time()

    async with trioq.open_queue(registry, workers=8) as queue:
        begin = trio.current_time()
        limited = await queue.enqueue_many([JobSpec("work") for _ in range(6)])
        unlimited = await queue.enqueue("free")
        done = await queue.wait(unlimited.id)
        assert done.result == pytest.approx(begin)  # not stuck behind the limited jobs
        for job in limited:
            assert (await queue.wait(job.id)).state is JobState.SUCCEEDED
        assert trio.current_time() - begin == pytest.approx(3.0, abs=0.05)  # 6 jobs, 2 at a time, 1 s each
    assert peak == {"gateway": 2}
    assert limited[0].limits == ("gateway",)


async def test_a_pattern_is_a_mutex_per_filled_key(autojump_clock: trio.testing.MockClock) -> None:
    """``user:*`` with ``max=1`` and a task naming ``user:{user}``: one attempt per user at a time."""
    registry = trioq.Registry()
    registry.limit("user:*", max=1)
    peak, starts = _tracked(registry, limits=["user:{user}"])
    async with trioq.open_queue(registry, workers=8) as queue:
        jobs = await queue.enqueue_many([JobSpec("work", {"user": u}) for u in "aabbbc"])
        for job in jobs:
            await queue.wait(job.id)
    assert peak == {"user:a": 1, "user:b": 1, "user:c": 1}
    assert sorted(jobs[0].limits + jobs[2].limits) == ["user:a", "user:b"]
    assert [t for t, u in starts if u == "b"] == pytest.approx([0.0, 1.0, 2.0], abs=0.05)


async def test_a_rate_limited_backlog_starts_at_the_rate(autojump_clock: trio.testing.MockClock) -> None:
    """``rate=5, burst=2``: two at once, then one every 0.2 s, started as each token comes due."""
    registry = trioq.Registry()
    registry.limit("api", rate=5.0, burst=2)
    _, starts = _tracked(registry, limits=["api"])
    async with trioq.open_queue(registry, workers=10) as queue:
        begin = trio.current_time()
        jobs = await queue.enqueue_many([JobSpec("work", {"seconds": 0.01}) for _ in range(7)])
        for job in jobs:
            await queue.wait(job.id)
    times = [t - begin for t, _ in starts]
    assert times == pytest.approx([0.0, 0.0, 0.2, 0.4, 0.6, 0.8, 1.0], abs=0.005)


async def test_enqueue_adds_keys_and_the_tenant_fills_templates(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    registry.limit("tenant:*", max=1)
    registry.limit("extra", max=1)
    peak, _ = _tracked(registry, limits=["tenant:{tenant}"])
    async with trioq.open_queue(registry, workers=4) as queue:
        one = await queue.enqueue("work", tenant="acme", limits=["extra"])
        two = await queue.enqueue("work", tenant="acme")
        assert one.limits == ("tenant:acme", "extra") and two.limits == ("tenant:acme",)
        await queue.wait(one.id)
        await queue.wait(two.id)
    assert peak == {"tenant:acme": 1, "extra": 1}


@pytest.mark.parametrize(
    ("task_limits", "options", "why"),
    [
        (["user:{user}"], {}, "needs payload field 'user'"),
        (["user:{user}"], {"payload": {"user": [1]}}, "takes a string or a 64-bit int"),
        (["user:{user}"], {"payload": {"user": True}}, "takes a string or a 64-bit int"),
        (["tenant:{tenant}"], {}, "needs the job's tenant"),
        ([], {"limits": ["nobody-declared-this"]}, "no limit is declared"),
        ([], {"limits": "gateway"}, "must be a list"),
        ([], {"limits": [""]}, "non-empty strings"),
        ([], {"limits": ["user:\x00"]}, "cannot be stored"),
    ],
)
async def test_keys_that_cannot_be_filled_or_resolved_are_refused(
    task_limits: list[str], options: dict[str, Any], why: str
) -> None:
    registry = trioq.Registry()
    registry.limit("user:*", max=1)
    registry.limit("tenant:*", max=1)
    registry.limit("gateway", max=1)

    @registry.task(limits=task_limits)
    async def job(ctx: trioq.JobContext, **payload: Any) -> None: ...

    payload = options.pop("payload", None)
    async with trioq.open_queue(registry, workers=0) as queue:
        with pytest.raises(trioq.InvalidJob, match=why) as caught:
            await queue.enqueue("job", payload, **options)
        assert caught.value.field == "limits"
        assert (await queue.stats())["jobs"]["ready"] == 0


@pytest.mark.parametrize(
    ("key", "bounds", "error"),
    [
        ("", {"max": 1}, ValueError),
        ("k", {}, ValueError),
        ("k", {"max": 0}, ValueError),
        ("k", {"max": 1.5}, TypeError),
        ("k", {"max": True}, TypeError),
        ("k", {"rate": 0}, ValueError),
        ("k", {"rate": -1}, ValueError),
        ("k", {"rate": math.inf}, ValueError),
        ("k", {"rate": 1, "per": 0}, ValueError),
        ("k", {"max": 1, "burst": 2}, ValueError),
        ("k", {"rate": 1, "burst": 0}, ValueError),
        ("a*b", {"max": 1}, ValueError),
        ("k\x00", {"max": 1}, ValueError),
    ],
)
def test_bad_limit_declarations_are_refused(key: str, bounds: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        trioq.Registry().limit(key, **bounds)


def test_a_limit_is_declared_once_and_templates_are_checked() -> None:
    registry = trioq.Registry()
    registry.limit("k", max=1)
    with pytest.raises(ValueError, match="declared already"):
        registry.limit("k", rate=1.0)
    for bad in (["user:{0}"], ["user:{u.id}"], ["user:{u!r}"], ["user:{u:>3}"], ["user:{"], "user", [""]):
        with pytest.raises((ValueError, TypeError)):

            @registry.task(name=f"t{id(bad)}", limits=bad)  # type: ignore[arg-type]
            async def t(ctx: trioq.JobContext) -> None: ...

    other = trioq.Registry()
    other.limit("k", max=2)
    with pytest.raises(ValueError, match="both registries"):
        registry.include(other)


async def test_limits_declared_after_the_queue_opened_are_refused_not_ignored() -> None:
    """The store learns the limits when the queue opens: a key declared later would be unbounded."""
    registry = trioq.Registry()

    @registry.task
    async def job(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        registry.limit("late", max=1)
        with pytest.raises(trioq.InvalidJob, match="before open_queue") as caught:
            await queue.enqueue("job", limits=["late"])
        assert caught.value.field == "limits"


@pytest.mark.parametrize(("rate", "per", "burst"), [(1e6, 1.0, None), (1.0, 1e-7, None), (1e-300, 1e10, None)])
def test_rates_the_clock_cannot_hold_are_refused(rate: float, per: float, burst: int | None) -> None:
    """Intervals under 0.1 ms vanish in the rounding of wall-clock floats (the bound would not hold), and
    an infinite one would mean "never" yet admit every start."""
    with pytest.raises(ValueError, match="out of range"):
        trioq.Registry().limit("k", rate=rate, per=per, burst=burst)


@pytest.mark.parametrize("extra", [False, 0, "", {}, "gateway", ["user:*"], ["a", 1]])
async def test_enqueue_limits_must_be_a_list_of_keys(extra: Any) -> None:
    registry = trioq.Registry()
    registry.limit("user:*", max=1)

    @registry.task
    async def job(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        with pytest.raises(trioq.InvalidJob) as caught:
            await queue.enqueue("job", limits=extra)
        assert caught.value.field == "limits"


async def test_a_template_value_must_be_a_64_bit_int_or_a_string() -> None:
    registry = trioq.Registry()
    registry.limit("user:*", max=1)

    @registry.task(limits=["user:{n}"])
    async def job(ctx: trioq.JobContext, n: Any) -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        with pytest.raises(trioq.InvalidJob, match="64-bit"):
            await queue.enqueue("job", {"n": 10**5000})
        assert (await queue.enqueue("job", {"n": 2**63 - 1})).limits == (f"user:{2**63 - 1}",)


@pytest.mark.parametrize("durable", [False, True])
async def test_stats_show_each_keys_use_cap_tokens_and_blocked_jobs(
    autojump_clock: trio.testing.MockClock, tmp_path: Any, durable: bool
) -> None:
    registry = trioq.Registry()
    registry.limit("gateway", max=2, rate=10, per=1.0, burst=3)
    registry.limit("user:*", max=1)
    registry.limit("idle", max=5)
    _tracked(registry, limits=["gateway", "user:{user}"])
    store = trioq.WALStore(tmp_path / "wal") if durable else trioq.MemoryStore()
    async with trioq.open_queue(registry, store=store, workers=8) as queue:
        before = (await queue.stats())["limits"]
        assert before["idle"] == {"in_use": 0, "cap": 5, "rate": None, "per": 1.0, "tokens": None, "blocked": 0}
        assert before["gateway"]["tokens"] == 3 and "user:*" not in before
        await queue.enqueue_many([JobSpec("work", {"seconds": 10.0, "user": "a"}) for _ in range(3)])
        await queue.enqueue("work", {"seconds": 10.0, "user": "b"})
        await trio.sleep(0.01)
        assert (await queue.stats())["limits"]["gateway"]["tokens"] == 1  # two of three spent just now
        await trio.sleep(1.0)
        limits = (await queue.stats())["limits"]
        # a's first and b's job hold gateway's two slots; a's other two wait for user:a's one slot.
        assert limits["gateway"]["in_use"] == 2 and limits["gateway"]["cap"] == 2
        assert limits["user:a"] == {"in_use": 1, "cap": 1, "rate": None, "per": 1.0, "tokens": None, "blocked": 2}
        assert limits["user:b"]["in_use"] == 1 and limits["user:b"]["blocked"] == 0
        # Two tokens of three spent 1 s ago at 10/s: both back by now.
        assert limits["gateway"]["tokens"] == 3
        await queue.join()
        after = (await queue.stats())["limits"]
        assert after["gateway"]["in_use"] == 0
        assert all(figures["in_use"] == 0 and figures["blocked"] == 0 for figures in after.values())
