"""The one rule for bad arguments (trioq/_validate.py): a job's fields raise InvalidJob naming the
field; a queue's or a task's configuration raises ValueError (TypeError for the wrong kind of object)."""

from __future__ import annotations

import math
from typing import Any

import pytest

import trioq


@pytest.mark.parametrize("factor", [math.nan, 0.5, True, "2"])
def test_backoff_refuses_a_bad_factor_naming_it(factor: Any) -> None:
    with pytest.raises(trioq.InvalidJob, match=r"backoff\.factor must be a number >= 1") as excinfo:
        trioq.Backoff(factor=factor)
    assert excinfo.value.field == "backoff.factor"


@pytest.mark.parametrize("value", [math.nan, -1.0, None])
def test_backoff_refuses_bad_base_max_and_jitter(value: Any) -> None:
    for name in ("base", "max", "jitter"):
        with pytest.raises(trioq.InvalidJob, match=rf"backoff\.{name} must be") as excinfo:
            trioq.Backoff(**{name: value})
        assert excinfo.value.field == f"backoff.{name}"
    assert trioq.Backoff(max=math.inf).max == math.inf


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("workers", -1, ValueError),
        ("workers", True, ValueError),
        ("heartbeat_timeout", 0, ValueError),
        ("shutdown_grace", math.nan, ValueError),
        ("max_ready", 0, ValueError),
        ("precise_timers", "yes", TypeError),
        ("poll_interval", 0, ValueError),
    ],
)
async def test_open_queue_options(option: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=f"{option} must be") as excinfo:
        async with trioq.open_queue(trioq.Registry(), **{option: value}):
            pass
    assert not isinstance(excinfo.value, trioq.InvalidJob)  # configuration, not a job's data


def test_task_options() -> None:
    registry = trioq.Registry()

    async def handler(ctx: trioq.JobContext) -> None: ...

    for options in ({"timeout": -1}, {"heartbeat_timeout": math.nan}, {"max_attempts": 0}, {"priority": 2**64}):
        with pytest.raises(ValueError, match=f"{next(iter(options))} must be") as excinfo:
            registry.add(handler, **options)  # type: ignore[arg-type]
        assert not isinstance(excinfo.value, trioq.InvalidJob)


@pytest.mark.parametrize("timeout", [True, -1, math.nan, "1"])
async def test_wait_timeout_is_a_job_argument(timeout: Any) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        job = await queue.enqueue("noop")
        with pytest.raises(trioq.InvalidJob, match="timeout must be a number >= 0") as excinfo:
            await queue.wait(job.id, timeout=timeout)
        assert excinfo.value.field == "timeout"
        with pytest.raises(trioq.WaitTimeout):
            await queue.wait(job.id, timeout=0)


async def test_enqueue_checks_payload_types_against_plain_annotations() -> None:
    """``{"n": "x"}`` for ``n: int`` is refused at enqueue (InvalidJob naming the payload), not retried;
    only plain JSON types are checked, and a float field takes an int."""
    registry = trioq.Registry()

    @registry.task
    async def typed(
        ctx: trioq.JobContext,
        n: int,
        ratio: float = 1.0,
        name: str | None = None,
        flag: bool = False,
        items: list[int] | None = None,
        extra: dict[str, Any] | None = None,
        anything: Any = None,
    ) -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        for good in [
            {"n": 1},
            {"n": 1, "ratio": 2},
            {"n": 1, "ratio": 0.5, "name": None, "flag": True, "items": [1], "extra": {}, "anything": ["x"]},
        ]:
            await queue.enqueue("typed", good)
        for bad, shown in [
            ({"n": "x"}, "'n' must be int"),
            ({"n": True}, "'n' must be int"),
            ({"n": 1.5}, "'n' must be int"),
            ({"n": 1, "ratio": "fast"}, "'ratio' must be int or float"),
            ({"n": 1, "name": 3}, "'name' must be str or None"),
            ({"n": 1, "flag": 1}, "'flag' must be bool"),
            ({"n": 1, "items": {}}, "'items' must be list or None"),
            ({"n": 1, "extra": []}, "'extra' must be dict or None"),
        ]:
            with pytest.raises(trioq.InvalidJob, match=shown) as excinfo:
                await queue.enqueue("typed", bad)
            assert excinfo.value.field == "payload"
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.enqueue_many([trioq.JobSpec("typed", {"n": 1}), trioq.JobSpec("typed", {"n": "2"})])
        assert excinfo.value.field == "jobs[1].payload"
        assert (await queue.stats())["jobs"]["ready"] == 3


def test_a_handler_whose_annotations_do_not_resolve_is_registered_unchecked() -> None:
    registry = trioq.Registry()

    async def later(ctx: trioq.JobContext, n: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
        ...

    registry.task(later)
    assert registry["later"].types == {}

    # An annotation whose evaluation raises anything at all (here ZeroDivisionError) is no reason to
    # refuse the handler: a type checker never evaluates it, and registration happens at import.
    async def odd(ctx: trioq.JobContext, n: 1 / 0) -> None:  # type: ignore[valid-type]
        ...

    registry.task(odd)
    assert registry["odd"].types == {}
