"""Make ``wal_v3/`` and ``wal_v3.json``: a WAL of log format 3, written by a trioq that writes format 3.

Run it with such a trioq, never the current one (the script refuses a trioq
that writes another format)::

    PYTHONPATH=<a trioq tree of format 3> python <this repo>/tests/stores/data/make_wal_v3.py OUT

The committed log was written by the working tree just before format 4
(whose table already knew named queues, though its WAL still wrote format 3).
The script only enqueues jobs of the default queue, with no tenant and no
deadline, so every record is what a format-3 release writes: ADD with its 8
fields, ENTRY with 15 or 17, no record of type 13 and up.

It writes ``OUT/wal_v3/`` (the log, as a ``kill -9`` would leave it: a copy
taken while the store was open, so one job is still ``running``) and
``OUT/wal_v3.json`` (each job's snapshot as that trioq saw it at the copy, by
a name saying what the job went through; ``OUT`` is ``tests/stores/data``).
Job ids are random: every run makes a different log. The log holds a
checkpoint (its ENTRY rows carry the jobs of phase A, errors, tracebacks and
snoozes included) and, after it, format-3 transition records of every type
(phase B, SNOOZE and a FAIL without retry included), over a few 4 KiB segments.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

import trio

from trioq.stores import ClaimRequest, Failed, NewJob, Released, Snoozed, StoreConfig, Succeeded
from trioq.stores.wal import WALStore, _format

START = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def job(n: int, priority: int, *, delay: float = 0.0, key: str | None = None, max_attempts: int = 3) -> NewJob:
    return NewJob("t", {"n": n, "text": "x" * (n % 7)}, priority, key, max_attempts, float(delay))


async def main(out: str) -> None:
    assert _format.VERSION == 3, f"this trioq writes WAL format {_format.VERSION}; run the script with one of format 3"
    clock = Clock()
    wal = os.path.join(out, "wal_v3.tmp")
    store = WALStore(wal, fsync="never", segment_size=4096)
    names: dict[str, str] = {}

    async def add(name: str, spec: NewJob) -> None:
        (added,) = await store.add([spec])
        names[name] = added.id

    async def claim(name: str) -> Any:
        # Jobs to claim are added at a priority above every ready job's, so
        # each claim takes the job named (checked).
        (got,) = await store.claim(ClaimRequest("make", 1))
        assert got.id == names[name], (name, got)
        return got

    async def complete(outcome: Any) -> None:
        (state,) = await store.complete([outcome])
        assert state is not None
        await store.sync()

    async with store.session(StoreConfig(clock=clock, retention=3600.0, max_retained=100_000)):
        # Phase A: these jobs reach the checkpoint's ENTRY rows.
        await add("a_evicted", job(0, 9, max_attempts=1))
        got = await claim("a_evicted")
        await complete(Succeeded(got.id, got.epoch, "gone"))
        clock.now += 4000.0  # past retention: evicted (a DROP record) in phase B
        await add("a_ready", job(1, 0, key="key-a"))
        await add("a_scheduled", job(2, 0, delay=10_000.0))
        await add("a_cancelled", job(3, 0))
        await add("a_done", job(4, 9))
        got = await claim("a_done")
        await complete(Succeeded(got.id, got.epoch, {"sent": [1, 2], "to": "a@b.c", "ok": True}))
        await add("a_failed", job(5, 9))
        got = await claim("a_failed")
        clock.now += 1.0
        await complete(Failed(got.id, got.epoch, "ValueError: once", 5000.0, "Traceback (a_failed)"))
        await add("a_dead", job(6, 9))
        got = await claim("a_dead")
        await complete(Failed(got.id, got.epoch, "NoRetry: x", None, "Traceback (a_dead)"))  # no retry
        await add("a_retried", job(7, 7, max_attempts=1))
        got = await claim("a_retried")
        await complete(Failed(got.id, got.epoch, "KeyError: 'y'", 1.0))
        await store.retry(names["a_retried"])
        await add("a_snoozed", job(8, 9))
        got = await claim("a_snoozed")
        await complete(Snoozed(got.id, got.epoch, 9000.0))  # a_snoozed: snoozes 1, scheduled
        await store.cancel(names["a_cancelled"])
        await add("a_running", job(9, 8))  # claimed in phase B
        await store.checkpoint()

        # Phase B: format-3 records after the checkpoint.
        clock.now += 1.0
        for i in range(40):  # enough to roll into more segments
            await add(f"b_filler_{i:02d}", job(100 + i, 0))
        await add("b_scheduled", job(10, 0, delay=20_000.0))
        await add("b_keyed", job(11, 0, key="key-b"))
        await add("b_cancelled", job(12, 0, delay=60.0))
        await store.cancel(names["b_cancelled"])  # a scheduled job
        await add("b_done", job(13, 9))
        got = await claim("b_done")
        clock.now += 1.0
        await complete(Succeeded(got.id, got.epoch, "plain"))
        await add("b_failed", job(14, 9))
        got = await claim("b_failed")
        await complete(Failed(got.id, got.epoch, "OSError: disk", 7000.0, "Traceback (b_failed)"))
        await add("b_dead", job(15, 9, max_attempts=2))
        for attempt in (1, 2):  # retried at once (ready), then dead: max_attempts reached
            got = await claim("b_dead")
            await complete(Failed(got.id, got.epoch, f"RuntimeError: try {attempt}", 0.0))
        await add("b_no_retry", job(16, 9))
        got = await claim("b_no_retry")
        await complete(Failed(got.id, got.epoch, "NoRetry: no", None, "Traceback (b_no_retry)"))
        await add("b_retried", job(17, 9, max_attempts=1))
        got = await claim("b_retried")
        await complete(Failed(got.id, got.epoch, "TypeError: once", 0.0))
        await add("b_snoozed", job(18, 9))
        for delay in (0.0, 8000.0):  # snoozed twice: ready again at once, then scheduled
            got = await claim("b_snoozed")
            await complete(Snoozed(got.id, got.epoch, delay))
        await claim("a_running")  # running at the "crash"
        await add("b_released", job(19, 9))
        for _ in range(2):  # two attempts cut off: ready, epoch 2, attempts 0
            got = await claim("b_released")
            await complete(Released(got.id, got.epoch))
        clock.now += 1.0
        await store.retry(names["b_retried"])
        assert await store.evict() == 1  # a_evicted: a DROP record
        await store.sync()
        expected: dict[str, Any] = {"a_evicted": {"id": names.pop("a_evicted"), "state": "evicted"}}
        for name, job_id in names.items():
            snapshot = (await store.get(job_id)).to_dict()
            for field in ("queue", "tenant", "deadline"):  # a format-3 job has none of these (nor Job, in a release)
                snapshot.pop(field, None)
            expected[name] = snapshot
        # The crash: what a kill -9 would leave, taken while the store is open.
        crashed = os.path.join(out, "wal_v3")
        shutil.rmtree(crashed, ignore_errors=True)
        shutil.copytree(wal, crashed, ignore=shutil.ignore_patterns("LOCK"))
    shutil.rmtree(wal)
    with open(os.path.join(out, "wal_v3.json"), "w") as f:
        f.write(
            "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(expected.items()))
        )
        f.write("\n}\n")


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
