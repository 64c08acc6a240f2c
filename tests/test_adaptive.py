import random

import pytest

import trioq
from trioq.policies.adaptive import AdaptiveCap
from trioq.policies.limits import FORGET_AFTER, LimitBook


def simulate(
    cap: AdaptiveCap, capacity: list[tuple[float, int]], until: float, seed: int = 1
) -> list[tuple[float, int]]:
    """Rounds of ``cap.cap`` calls to a dependency of capacity C (changing at the times given)."""
    rng, now, seen, l0 = random.Random(seed), 0.0, [], 1.0
    while now < until:
        c = cap.cap
        big_c = [k for t, k in capacity if t <= now][-1]
        over = max(0, c - big_c)
        latency = l0 * (1 + 0.5 * over)
        for _ in range(c):
            cap.started()
        now += latency
        for _ in range(c):
            jittered = latency * rng.uniform(0.9, 1.1)
            cap.observe(now, jittered, failed=rng.random() < min(0.9, 0.25 * over))
        seen.append((now, cap.cap))
    return seen


def test_starts_at_min_and_converges_near_capacity() -> None:
    cap = AdaptiveCap(trioq.Adaptive(1, 8))
    assert cap.cap == 1
    seen = simulate(cap, [(0.0, 4)], until=60.0)
    late = [c for t, c in seen if t > 10.0]
    assert 3 <= sum(late) / len(late) <= 5
    assert all(1 <= c <= 8 for _, c in seen)


def test_falls_on_capacity_drop() -> None:
    cap = AdaptiveCap(trioq.Adaptive(1, 8))
    seen = simulate(cap, [(0.0, 6), (30.0, 3)], until=40.0)
    before = [c for t, c in seen if 20.0 < t <= 30.0]
    assert max(before) >= 5
    after = [c for t, c in seen if t > 33.0]
    assert after and max(after) <= 4


def test_overloaded_cuts_once_a_window() -> None:
    cap = AdaptiveCap(trioq.Adaptive(1, 8))
    for i in range(40):
        for _ in range(8):
            cap.started()
        for _ in range(8):
            cap.observe(float(i + 1), 1.0)
    assert cap.cap == 8
    cap.observe(41.0, 1.0, failed=True)
    assert cap.cap == 4
    cap.overloaded(42.0)  # within the windows skipped after the cut: the same overload's echo
    assert cap.cap == 4
    cap.overloaded(42.6)
    assert cap.cap == 2


def test_a_failed_probe_is_undone_not_halved() -> None:
    cap = AdaptiveCap(trioq.Adaptive(1, 8))
    t = 0.0
    while cap.cap < 4:  # climb: 4 in flight each window, no queueing
        t += 1.0
        for _ in range(4):
            cap.started()
        for _ in range(4):
            cap.observe(t, 1.0)
    cap.observe(t + 2.0, 1.0, failed=True)  # the growth to 4 was a probe: back to 3
    assert cap.cap == 3


def test_an_unfilled_cap_does_not_grow() -> None:
    cap = AdaptiveCap(trioq.Adaptive(1, 8))
    for i in range(20):  # one attempt at a time, never queueing: the cap is not the bottleneck
        cap.started()
        cap.observe(float(i + 1), 1.0)
    assert cap.cap == 3  # grown while one in flight was at least half of it


def test_probes_past_capacity_grow_rarer() -> None:
    cap = AdaptiveCap(trioq.Adaptive(1, 8))
    seen = simulate(cap, [(0.0, 3)], until=200.0)
    over = [t for t, c in seen if c > 3 and t > 20.0]
    rounds = [t for t, c in seen if t > 20.0]
    assert len(over) <= 0.15 * len(rounds)


def test_book_resolves_current_cap_per_concrete_key() -> None:
    book = LimitBook()
    book.declare("api:*", max=trioq.Adaptive(2, 6))
    book.declare("plain", max=3)
    assert book.resolve("api:a").max == 2  # type: ignore[union-attr]
    for i in range(20):
        for _ in range(3):
            book.started(["api:a", "plain"])
        for _ in range(3):
            book.observe(["api:a", "plain"], float(i + 1), 1.0)
    assert book.resolve("api:a").max == 6  # type: ignore[union-attr]
    assert book.resolve("api:b").max == 2  # type: ignore[union-attr]
    assert book.resolve("plain").max == 3  # type: ignore[union-attr]
    assert book.is_adaptive("api:x") and not book.is_adaptive("plain")
    other = LimitBook()
    other.include(book)
    assert other.is_adaptive("api:z")


def test_registry_validation() -> None:
    reg = trioq.Registry()
    assert reg.limit("search", max=trioq.Adaptive(min=1, max=8)).max == 8
    with pytest.raises(TypeError, match="Adaptive"):
        reg.limit("x", max=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        trioq.Adaptive(3, 2)
    with pytest.raises(TypeError):
        trioq.Adaptive(1.0, 2)  # type: ignore[arg-type]


async def test_runtime_cap_tracks_a_dependency_and_never_passes_its_max(autojump_clock: object) -> None:
    """Through the runtime: attempts holding an adaptive key report to its cap, which the store
    enforces. A dependency of capacity 3 (slower and failing above it) ends up run near 3 at once,
    never above ``Adaptive.max``, from a start at ``min``; ``Overloaded`` ends up as the job's error."""
    import trio

    capacity, rng = 3, random.Random(7)
    registry = trioq.Registry()
    registry.limit("dep", max=trioq.Adaptive(min=1, max=5))
    inside = 0
    starts: list[tuple[float, int]] = []  # (time, calls in the dependency after this one started)
    failures = 0

    @registry.task(limits=["dep"], max_attempts=20, backoff=trioq.Backoff(base=0.05, jitter=0.0))
    async def call(ctx: trioq.JobContext) -> None:
        nonlocal inside, failures
        inside += 1
        starts.append((trio.current_time(), inside))
        over = max(0, inside - capacity)
        try:
            await trio.sleep(0.05 * (1 + 0.5 * over))
            if rng.random() < min(0.9, 0.25 * over):
                failures += 1
                raise trioq.Overloaded(f"{inside} calls, capacity {capacity}")
        finally:
            inside -= 1

    async with trioq.open_queue(registry, workers=8) as queue:
        for _ in range(600):
            await queue.enqueue("call")
        await queue.join()
        counts = (await queue.stats())["jobs"]
    assert counts["succeeded"] == 600
    assert max(n for _, n in starts) <= 5
    assert starts[0][1] == 1
    half = starts[len(starts) // 2][0]
    late = [n for t, n in starts if t >= half]
    assert 2.0 <= sum(late) / len(late) <= 4.0, sum(late) / len(late)
    assert failures <= 0.1 * len(starts)


async def test_overloaded_is_the_jobs_error(autojump_clock: object) -> None:
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def busy(ctx: trioq.JobContext) -> None:
        raise trioq.Overloaded("pool exhausted")

    async with trioq.open_queue(registry) as queue:
        job = await queue.wait((await queue.enqueue("busy")).id)
    assert job.state == "dead"
    assert job.error == "Overloaded: pool exhausted"


def test_asking_creates_no_controller_and_idle_ones_are_forgotten() -> None:
    book = LimitBook()
    book.declare("user:*", max=trioq.Adaptive(2, 6))
    for i in range(1000):
        assert book.resolve(f"user:{i}").max == 2  # type: ignore[union-attr]
    assert book._caps == {}
    for i in range(100):
        book.started([f"user:{i}"])
        book.observe([f"user:{i}"], 1.0, 0.5)
    assert len(book._caps) == 100
    book.started(["user:busy"])  # in flight: kept however long
    book.observe(["user:0"], 1.0 + FORGET_AFTER + 1.0, 0.5)  # user:0 was just seen: kept
    assert set(book._caps) == {"user:0", "user:busy"}


def test_a_zero_latency_window_does_not_pin_the_cap() -> None:
    """A coarse clock can report 0 s: the baseline must not stay 0 (every later window would look
    queued and shrink the cap for ever)."""
    cap = AdaptiveCap(trioq.Adaptive(1, 8))
    for _ in range(4):
        cap.started()
    for _ in range(4):
        cap.observe(1.0, 0.0)
    t = 1.0
    for _ in range(200):
        t += 1.0
        for _ in range(8):
            cap.started()
        for _ in range(8):
            cap.observe(t, 1.0)
    assert cap.cap == 8


async def test_shutdown_and_job_errors_leave_the_controller_as_it_should(autojump_clock: object) -> None:
    """An attempt cut off by shutdown ends for its keys (nothing left counted in flight), and errors
    that doom the job whatever the dependency does (NoRetry) do not cut the cap."""
    import trio

    registry = trioq.Registry()
    registry.limit("dep", max=trioq.Adaptive(min=4, max=8))

    @registry.task(limits=["dep"])
    async def forever(ctx: trioq.JobContext) -> None:
        await trio.sleep_forever()

    @registry.task(limits=["dep"], max_attempts=1)
    async def bad(ctx: trioq.JobContext) -> None:
        raise trioq.NoRetry("payload invalid")

    async with trioq.open_queue(registry, workers=4, shutdown_grace=0.1) as queue:
        for _ in range(3):
            await queue.wait((await queue.enqueue("bad")).id)
        assert registry.limits.resolve("dep").max == 4  # type: ignore[union-attr]
        for _ in range(2):
            await queue.enqueue("forever")
        await trio.sleep(1.0)
        assert registry.limits._caps["dep"].inflight == 2
    assert registry.limits._caps["dep"].inflight == 0
