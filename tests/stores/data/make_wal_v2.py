"""Make ``wal_v2/`` and ``wal_v2.json``: a WAL of log format 2, written by trioq at commit fceb23c.

Run it with that trioq, never the current one (the store protocol it drives,
``claim()`` / ``succeed`` / ``fail(..., retry_at)`` / ``release``, is the old
one; the script refuses a trioq that writes another format)::

    cd <a checkout of fceb23c> && PYTHONPATH=. python <this repo>/tests/stores/data/make_wal_v2.py OUT

It writes ``OUT/wal_v2/`` (the log, as a ``kill -9`` would leave it: a copy
taken while the store was open, so one job is still ``running``) and
``OUT/wal_v2.json`` (each job's snapshot as that trioq saw it at the copy, by
a name saying what the job went through; ``OUT`` is ``tests/stores/data``).
Job ids are random: every run makes a different log. The log holds a checkpoint (its
ENTRY rows carry the jobs of phase A) and, after it, format-2 transition
records of every type (phase B), over a few 4 KiB segments.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

import trio

from trioq.stores import NewJob, StoreConfig
from trioq.stores.wal import WALStore, _format

START = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def job(
    clock: Clock, n: int, priority: int, *, delay: float = 0.0, key: str | None = None, max_attempts: int = 3
) -> NewJob:
    return NewJob("t", {"n": n, "text": "x" * (n % 7)}, priority, key, max_attempts, clock.now + delay)


async def main(out: str) -> None:
    assert _format.VERSION == 2, f"this trioq writes WAL format {_format.VERSION}; run the script with fceb23c"
    clock = Clock()
    wal = os.path.join(out, "wal_v2.tmp")
    store = WALStore(wal, fsync="never", segment_size=4096)
    names: dict[str, str] = {}

    async def add(name: str, spec: NewJob) -> None:
        (added,) = await store.add([spec])
        names[name] = added.id

    async def claim(name: str) -> Any:
        # Jobs to claim are added at a priority above every ready job's, so
        # each claim takes the job named (checked).
        got = await store.claim()
        assert got is not None and got.id == names[name], (name, got)
        return got

    async with store.session(StoreConfig(clock=clock, retention=3600.0, max_retained=100_000)):
        # Phase A: these jobs reach the checkpoint's ENTRY rows.
        await add("a_evicted", job(clock, 0, 9, max_attempts=1))
        got = await claim("a_evicted")
        assert await store.succeed(got.id, got.epoch, "gone")
        clock.now += 4000.0  # past retention: evicted (a DROP record) in phase B
        await add("a_ready", job(clock, 1, 0, key="key-a"))
        await add("a_scheduled", job(clock, 2, 0, delay=10_000.0))
        await add("a_cancelled", job(clock, 3, 0))
        await add("a_done", job(clock, 4, 9))
        got = await claim("a_done")
        assert await store.succeed(got.id, got.epoch, {"sent": [1, 2], "to": "a@b.c", "ok": True})
        await add("a_failed", job(clock, 5, 9))
        got = await claim("a_failed")
        clock.now += 1.0
        assert await store.fail(got.id, got.epoch, "ValueError: once", clock.now + 5000.0) is not None
        await add("a_dead", job(clock, 6, 9, max_attempts=1))
        got = await claim("a_dead")
        assert await store.fail(got.id, got.epoch, "KeyError: 'x'", clock.now + 1.0) is not None
        await add("a_retried", job(clock, 7, 7, max_attempts=1))
        got = await claim("a_retried")
        assert await store.fail(got.id, got.epoch, "KeyError: 'y'", clock.now + 1.0) is not None
        await store.retry(names["a_retried"])
        await store.cancel(names["a_cancelled"])
        await add("a_running", job(clock, 8, 8))  # claimed in phase B
        await store.checkpoint()

        # Phase B: format-2 records after the checkpoint.
        clock.now += 1.0
        for i in range(40):  # enough to roll into more segments
            await add(f"b_filler_{i:02d}", job(clock, 100 + i, 0))
        await add("b_scheduled", job(clock, 9, 0, delay=20_000.0))
        await add("b_keyed", job(clock, 10, 0, key="key-b"))
        await add("b_cancelled", job(clock, 11, 0, delay=60.0))
        await store.cancel(names["b_cancelled"])  # a scheduled job
        await add("b_done", job(clock, 12, 9))
        got = await claim("b_done")
        clock.now += 1.0
        assert await store.succeed(got.id, got.epoch, "plain")
        await add("b_failed", job(clock, 13, 9))
        got = await claim("b_failed")
        assert await store.fail(got.id, got.epoch, "OSError: disk", clock.now + 7000.0) is not None
        await add("b_dead", job(clock, 14, 9, max_attempts=2))
        for attempt in (1, 2):  # retried at once (ready), then dead: max_attempts reached
            got = await claim("b_dead")
            assert await store.fail(got.id, got.epoch, f"RuntimeError: try {attempt}", clock.now) is not None
        await add("b_retried", job(clock, 15, 9, max_attempts=1))
        got = await claim("b_retried")
        assert await store.fail(got.id, got.epoch, "TypeError: once", clock.now) is not None
        await claim("a_running")  # running at the "crash"
        await add("b_released", job(clock, 16, 9))
        for _ in range(2):  # two attempts cut off: ready, epoch 2, attempts 0
            got = await claim("b_released")
            assert await store.release(got.id, got.epoch) is not None
        clock.now += 1.0
        await store.retry(names["b_retried"])
        assert await store.evict() == 1  # a_evicted: a DROP record
        await store.sync()
        expected: dict[str, Any] = {"a_evicted": {"id": names.pop("a_evicted"), "state": "evicted"}}
        for name, job_id in names.items():
            expected[name] = (await store.get(job_id)).to_dict()
        # The crash: what a kill -9 would leave, taken while the store is open.
        crashed = os.path.join(out, "wal_v2")
        shutil.rmtree(crashed, ignore_errors=True)
        shutil.copytree(wal, crashed, ignore=shutil.ignore_patterns("LOCK"))
    shutil.rmtree(wal)
    with open(os.path.join(out, "wal_v2.json"), "w") as f:
        f.write(
            "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(expected.items()))
        )
        f.write("\n}\n")


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
