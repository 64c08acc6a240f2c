"""Make ``wal_v4/`` and ``wal_v4.json``: a WAL of log format 4, written by a trioq that writes format 4.

Run it with such a trioq, never the current one (the script refuses a trioq
that writes another format)::

    PYTHONPATH=<a trioq tree of format 4> python <this repo>/tests/stores/data/make_wal_v4.py OUT

The committed log was written by commit 0fcebc5 (the last to write format 4).
The session declares three limit keys (:data:`LIMITS`, as the tests that read
the log do): ``api`` (a rate: one start a second), ``hourly`` (a rate: one
start an hour) and ``smtp`` (at most 2 running at once).

It writes ``OUT/wal_v4/`` (the log, as a ``kill -9`` would leave it: a copy
taken while the store was open, so one job is still ``running``: ``a_running``,
of queue ``email``, tenant ``acme``, holding ``smtp``) and ``OUT/wal_v4.json``
(each job's snapshot as that trioq saw it at the copy, by a name saying what
the job went through, queue, tenant, limits and deadline included; ``OUT`` is
``tests/stores/data``). Job ids are random: every run makes a different log;
the times are not (the copy is taken at ``START + 4006.0``, :data:`END`).

The log holds a checkpoint and, after it, format-4 transition records of every
type (phase B), over a few 4 KiB segments:

- the checkpoint's BEGIN holds a paused queue (``reports``) and rate tokens
  (``api`` due at ``START + 4002``, ``hourly`` at ``START + 7601``); its ENTRY
  rows (the jobs of phase A) carry errors, tracebacks and snoozes, and every
  run of the trailing fields: 17 fields (the default queue, nothing else), 18
  (a queue), 19 (a tenant), 20 (limit keys), 22 (a deadline; one of them a job
  that started, which its deadline no longer cancels);
- phase B: ADD with 8, 9 (queue), 10 (tenant), 11 (limits) and 13 (deadline)
  fields; CLAIM with its time (a job holding limit keys: ``b_api_done``, the
  last claim, at :data:`END`, so ``api``'s next token is due at ``END + 1``)
  and without; SUCCEED, FAIL (with and without retry), RELEASE, CANCEL,
  RETRY (one of a job whose deadline the retry clears), DROP, SNOOZE; EXPIRE
  (``b_expired``, past its deadline); PAUSE and RESUME (``email`` paused and
  resumed, ``bulk`` paused and left so). At the copy ``bulk`` and ``reports``
  are paused; ``b_hourly`` (``hourly``) is ready and passed over, its token
  due at ``START + 7601``; ``a_limited`` and ``b_api_waiting`` (``api``) are
  ready, the next token due at ``END + 1``.

No record is of a type above 15, and no ADD has a 15th field (format 5's).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

import trio

import trioq
from trioq._model import Limit
from trioq.stores import ClaimRequest, Failed, NewJob, Released, Snoozed, StoreConfig, Succeeded
from trioq.stores.wal import WALStore, _format

START = 1_700_000_000.0
#: The time of the copy (and of the last claim).
END = START + 4006.0
LIMITS = {
    "api": Limit("api", rate=1.0),
    "hourly": Limit("hourly", rate=1.0, per=3600.0),
    "smtp": Limit("smtp", max=2),
}


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def job(
    n: int,
    priority: int,
    *,
    delay: float = 0.0,
    key: str | None = None,
    max_attempts: int = 3,
    queue: str = "default",
    tenant: str | None = None,
    deadline: float | None = None,
    limits: tuple[str, ...] = (),
) -> NewJob:
    return NewJob(
        "t", {"n": n, "text": "x" * (n % 7)}, priority, key, max_attempts, float(delay), queue, tenant, deadline, limits
    )


async def main(out: str) -> None:
    assert _format.VERSION == 4, f"this trioq writes WAL format {_format.VERSION}; run the script with one of format 4"
    print(f"trioq from {os.path.dirname(trioq.__file__)}, WAL format {_format.VERSION}")
    clock = Clock()
    wal = os.path.join(out, "wal_v4.tmp")
    shutil.rmtree(wal, ignore_errors=True)  # a failed run's
    store = WALStore(wal, fsync="never", segment_size=4096)
    names: dict[str, str] = {}

    async def add(name: str, spec: NewJob) -> None:
        (added,) = await store.add([spec])
        names[name] = added.id

    async def claim(name: str) -> Any:
        # Jobs to claim are added at a priority above every claimable ready job's,
        # so each claim takes the job named (checked).
        (got,) = await store.claim(ClaimRequest("make", 1))
        assert got.id == names[name], (name, got)
        return got

    async def complete(outcome: Any) -> None:
        (state,) = await store.complete([outcome])
        assert state is not None
        await store.sync()

    config = StoreConfig(clock=clock, retention=3600.0, max_retained=100_000, limits=LIMITS.get)
    async with store.session(config):
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
        # Format 4: each run of ENTRY's trailing fields, a paused queue and rate tokens.
        await add("a_queued", job(20, 0, queue="reports"))  # 18 fields; its queue paused below
        await add("a_tenant", job(21, 0, queue="email", tenant="acme", key="key-t"))  # 19
        await add("a_limited", job(22, 0, limits=("api",)))  # 20: ready, "api"
        await add("a_deadline", job(23, 0, queue="email", tenant="globex", deadline=100_000.0))  # 22
        await add("a_deadline_scheduled", job(24, 0, delay=50_000.0, deadline=100_000.0, tenant="acme"))  # 22
        await add("a_deadline_started", job(25, 9, queue="email", deadline=30.0))
        got = await claim("a_deadline_started")  # started: its deadline no longer cancels it
        await complete(Failed(got.id, got.epoch, "TimeoutError: slow", 20_000.0, "Traceback (a_deadline_started)"))
        await add("a_hourly_done", job(26, 9, limits=("hourly",), tenant="acme"))
        got = await claim("a_hourly_done")  # "hourly": its next token an hour on
        await complete(Succeeded(got.id, got.epoch, [1, "two"]))
        await add("a_api_done", job(27, 9, queue="email", tenant="acme", limits=("api", "smtp")))
        got = await claim("a_api_done")  # "api": its next token a second on
        await complete(Succeeded(got.id, got.epoch, None))
        assert await store.pause("reports")
        await add("a_running", job(9, 8, queue="email", tenant="acme", limits=("smtp",)))  # claimed in phase B
        assert await store.limit_usage() == {"api": (0, 0, START + 4002.0), "hourly": (0, 0, START + 4001.0 + 3600.0)}
        await store.checkpoint()

        # Phase B: format-4 records after the checkpoint.
        clock.now += 1.0  # START + 4002: "api"'s token is due
        for i in range(40):  # enough to roll into more segments
            await add(f"b_filler_{i:02d}", job(100 + i, 0))
        await add("b_scheduled", job(10, 0, delay=20_000.0))
        await add("b_keyed", job(11, 0, key="key-b"))
        await add("b_cancelled", job(12, 0, delay=60.0))
        await store.cancel(names["b_cancelled"])  # a scheduled job
        # ADDs with each run of trailing fields.
        await add("b_queued", job(30, 9, queue="bulk"))  # 9 fields; "bulk" paused below, before any claim
        await add("b_tenant", job(31, 0, tenant="initech", key="key-c"))  # 10
        await add("b_limited", job(32, 0, queue="email", tenant="acme", limits=("smtp", "api")))  # 11
        await add("b_deadline", job(33, 0, deadline=100_000.0))  # 13
        await add("b_expired", job(34, 0, queue="email", tenant="acme", deadline=1.0))  # 13: expires below
        await add("b_hourly", job(35, 9, limits=("hourly",)))  # ready, no token until START + 7601
        assert await store.pause("bulk")
        assert await store.pause("email") and await store.resume("email")
        await add("b_done", job(13, 9))
        got = await claim("b_done")  # b_hourly is passed over: no token
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
        await add("b_deadline_retried", job(36, 9, queue="email", deadline=500.0))
        got = await claim("b_deadline_retried")
        await complete(Failed(got.id, got.epoch, "NoRetry: late", None))
        await store.retry(names["b_deadline_retried"])  # ready, its deadline cleared (a retry clears it)
        # The retried job is ready at priority 9 again: claim it now, then succeed.
        got = await claim("b_deadline_retried")
        await complete(Succeeded(got.id, got.epoch, {"late": True}))
        await add("b_deadline_started", job(37, 9, tenant="acme", deadline=1.0))
        got = await claim("b_deadline_started")
        await complete(Snoozed(got.id, got.epoch, 8000.0))  # scheduled, started: past its deadline, it stays
        await claim("a_running")  # running at the "crash" (a CLAIM with its time: it holds "smtp")
        clock.now += 2.0  # START + 4005: past b_expired's and b_deadline_started's deadlines
        await add("b_released", job(19, 9))
        for _ in range(2):  # two attempts cut off: ready, epoch 2, attempts 0 (the first claim expires b_expired)
            got = await claim("b_released")
            await complete(Released(got.id, got.epoch))
        clock.now += 1.0  # END
        await store.retry(names["b_retried"])
        assert await store.evict() == 1  # a_evicted: a DROP record
        await add("b_api_done", job(38, 10, limits=("api",)))
        got = await claim("b_api_done")  # the last claim, at END: "api"'s next token at END + 1
        await complete(Succeeded(got.id, got.epoch, "api"))
        await add("b_api_waiting", job(39, 9, limits=("api",)))  # ready: no token until END + 1
        assert clock.now == END
        usage = await store.limit_usage()
        assert usage == {"api": (0, 0, END + 1.0), "hourly": (0, 0, START + 4001.0 + 3600.0), "smtp": (1, 0, None)}, (
            usage
        )
        assert await store.paused() == ["bulk", "reports"]
        await store.sync()
        expected: dict[str, Any] = {"a_evicted": {"id": names.pop("a_evicted"), "state": "evicted"}}
        for name, job_id in names.items():
            expected[name] = (await store.get(job_id)).to_dict()
        assert expected["b_expired"]["state"] == "cancelled"
        assert expected["b_deadline_started"]["state"] == "scheduled"
        assert expected["b_deadline_retried"]["deadline"] is None
        assert expected["a_running"]["state"] == "running"
        # The crash: what a kill -9 would leave, taken while the store is open.
        crashed = os.path.join(out, "wal_v4")
        shutil.rmtree(crashed, ignore_errors=True)
        shutil.copytree(wal, crashed, ignore=shutil.ignore_patterns("LOCK"))
    shutil.rmtree(wal)
    with open(os.path.join(out, "wal_v4.json"), "w") as f:
        f.write(
            "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(expected.items()))
        )
        f.write("\n}\n")


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
