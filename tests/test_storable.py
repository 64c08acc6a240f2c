"""What a store can hold, through the queue: names, error texts, sizes.

Every string and value that goes into a store's record is checked before the
store changes (names and payloads at enqueue, results at success) or made
storable (error texts), so no record the log cannot encode or read back is
ever written. The store-level rules are in ``tests/stores/test_conformance.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trioq
from trioq import Backoff, JobSpec, JobState
from trioq._model import MAX_ERROR_CHARS, MAX_NAME_BYTES, MAX_VALUE_BYTES
from trioq.stores.wal._format import FRAME_OVERHEAD, MAX_PAYLOAD

NO_WAIT = Backoff(base=0.0, jitter=0.0)


def _store(kind: str, path: Path) -> trioq.Store:
    return trioq.MemoryStore() if kind == "memory" else trioq.WALStore(path / "wal", fsync="always")


@pytest.mark.parametrize("kind", ["memory", "wal"])
@pytest.mark.parametrize("key", ["k\udcff", "k\x00", "k" * (MAX_NAME_BYTES + 1)], ids=["surrogate", "nul", "long"])
async def test_a_key_the_store_cannot_hold_is_refused_and_the_log_still_opens(
    kind: str, key: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> str:
        return "done"

    store = _store(kind, tmp_path)
    async with trioq.open_queue(registry, store=store, workers=2) as queue:
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.enqueue("noop", key=key)
        assert excinfo.value.field == "key"
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.enqueue_many([JobSpec("noop"), JobSpec("noop", key=key)])
        assert excinfo.value.field == "jobs[1].key"
        job = await queue.enqueue("noop", key="fine")
        assert (await queue.wait(job.id)).result == "done"
        assert (await queue.stats())["jobs"]["succeeded"] == 1
    if kind == "wal":
        async with trioq.open_queue(registry, store=_store(kind, tmp_path), workers=0) as queue:
            assert (await queue.stats())["jobs"] == {**dict.fromkeys((s.value for s in JobState), 0), "succeeded": 1}


@pytest.mark.parametrize("name", ["t\udcff", "t\x00", "t" * (MAX_NAME_BYTES + 1)], ids=["surrogate", "nul", "long"])
def test_a_task_name_the_store_cannot_hold_is_refused_at_registration(name: str) -> None:
    registry = trioq.Registry()

    async def handler(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(ValueError, match="cannot be stored"):
        registry.task(name=name)(handler)
    assert name not in registry


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


_RAISED: dict[str, BaseException] = {
    "surrogate": FileNotFoundError("missing " + os.fsdecode(b"caf\xe9.txt")),
    "unprintable": _Unprintable(),
    "huge": ValueError("x" * (MAX_ERROR_CHARS * 3)),
}
_STORED = {
    "surrogate": "FileNotFoundError: missing caf\\udce9.txt",
    "unprintable": "_Unprintable: <str() of the error raised RuntimeError>",
}


@pytest.mark.parametrize("kind", ["async", "thread"])
@pytest.mark.parametrize("error", sorted(_RAISED))
async def test_an_error_text_the_log_cannot_encode_fails_the_attempt_not_the_queue(
    kind: str, error: str, tmp_path: Path
) -> None:
    # FileNotFoundError("missing caf\udce9.txt") once made the FAIL record raise
    # inside the worker: open_queue exited, the attempt was released uncounted,
    # and every restart ran the job and died again.
    registry = trioq.Registry()

    def raise_it(ctx: Any) -> None:
        raise _RAISED[error]

    async def raise_async(ctx: Any) -> None:
        raise_it(ctx)

    registry.add(raise_async if kind == "async" else raise_it, name="bad", kind=kind, max_attempts=2, backoff=NO_WAIT)

    @registry.task
    async def after(ctx: trioq.JobContext) -> str:
        return "the queue is still up"

    store = trioq.WALStore(tmp_path / "wal", fsync="always")
    async with trioq.open_queue(registry, store=store, workers=1) as queue:
        bad = await queue.enqueue("bad")
        with trio.fail_after(10):
            dead = await queue.wait(bad.id)
            ok = await queue.wait((await queue.enqueue("after")).id)
    assert (dead.state, dead.attempts) == (JobState.DEAD, 2)
    assert ok.result == "the queue is still up"
    async with trioq.open_queue(registry, store=trioq.WALStore(tmp_path / "wal"), workers=0) as queue:
        reopened = await queue.get(bad.id)
    assert reopened == dead
    assert dead.error is not None
    if error == "huge":  # cut once, by the worker; the store leaves it as it is
        cut = len(f"ValueError: {'x' * (MAX_ERROR_CHARS * 3)}") - (MAX_ERROR_CHARS - 40)
        assert len(dead.error) <= MAX_ERROR_CHARS and dead.error.endswith(f"... ({cut} more characters cut)")
    else:
        assert dead.error == _STORED[error]


async def test_a_payload_at_the_size_limit_runs_and_a_result_over_it_fails_the_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = trioq.Registry()
    seen: list[int] = []

    @registry.task(max_attempts=1)
    async def big(ctx: trioq.JobContext, blob: str, reply: int) -> str:
        seen.append(len(blob))
        return "x" * reply

    at_limit = "x" * (MAX_VALUE_BYTES - 32)  # its msgpack framing stays within the limit
    async with trioq.open_queue(registry, workers=1) as queue:
        with pytest.raises(trioq.InvalidJob, match="256 MiB") as excinfo:
            await queue.enqueue("big", {"blob": at_limit + "x" * 64, "reply": 0})
        assert excinfo.value.field == "payload"
        fits = await queue.enqueue("big", {"blob": at_limit, "reply": 3})
        too_big = await queue.enqueue("big", {"blob": "", "reply": MAX_VALUE_BYTES + 1})
        done, failed = await queue.wait(fits.id), await queue.wait(too_big.id)
    assert seen == [len(at_limit), 0]
    assert (done.state, done.result) == (JobState.SUCCEEDED, "xxx")
    assert failed.state is JobState.DEAD and failed.attempts == 1
    assert failed.error is not None and failed.error.startswith("InvalidJob: result cannot be stored")
    assert "256 MiB" in failed.error


def test_a_job_at_every_limit_fits_one_wal_record() -> None:
    """A checkpoint writes each job as one record holding its payload, result, error,
    key and task name: every one at its limit must still fit the record limit."""
    error_bytes = 4 * MAX_ERROR_CHARS + 100  # UTF-8, with the "... cut" note
    other_fields = 20 * 9  # ints, floats, the id, the state: a few bytes each, generously
    worst = 2 * (MAX_VALUE_BYTES + 16) + 2 * (MAX_NAME_BYTES + 5) + error_bytes + other_fields + FRAME_OVERHEAD
    assert worst < MAX_PAYLOAD


@pytest.mark.slow
async def test_a_job_at_the_size_limits_survives_a_checkpoint_and_a_reopen(tmp_path: Path) -> None:
    """Payload and result both at their limit, through a checkpoint (one record holds both)."""
    registry = trioq.Registry()

    @registry.task
    async def echo(ctx: trioq.JobContext, blob: str) -> str:
        return blob

    blob = "y" * (MAX_VALUE_BYTES - 32)
    # Segments larger than the records: at the default 64 MiB each 128 MiB record rolls the segment, and
    # each roll's checkpoint rewrites the live job (about 15 s of this test, on rolls tests/stores covers).
    big = trioq.WALStore(tmp_path / "wal", fsync="never", segment_size=1024 * 1024 * 1024)
    async with trioq.open_queue(registry, store=big, workers=1) as queue:
        job = await queue.enqueue("echo", {"blob": blob}, key="k" * MAX_NAME_BYTES)
        assert (await queue.wait(job.id)).state is JobState.SUCCEEDED
        store = queue.store
        assert isinstance(store, trioq.WALStore)
        await store.checkpoint()
    store = trioq.WALStore(tmp_path / "wal", fsync="never")
    async with trioq.open_queue(registry, store=store, workers=0) as queue:
        again = await queue.get(job.id)
    assert store.recovery is not None and store.recovery.checkpoints_seen == 1
    assert again.result == blob and again.payload == {"blob": blob}
