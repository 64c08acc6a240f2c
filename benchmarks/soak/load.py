"""What the soak asks of the queue: the enqueuer (the job mix at a fixed rate) and the cancels and retries.

``producer`` is anything with the :class:`trioq.Queue` calls used here
(``enqueue_many``, ``get``, ``cancel``, ``retry``): a producer-only
``open_queue`` on PostgreSQL, or a :class:`trioq.client.AsyncClient` in front
of ``trioq serve`` (WAL). Every batch carries an idempotency key per job, so a
call cut off by a kill or a database restart (its outcome unknown) is sent
again until it is answered: a job counts as acknowledged once an answer
names it, and each acknowledgement is a line of ``acks.jsonl``.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter, deque
from pathlib import Path
from typing import IO, Any

import trio

import trioq

from .procs import Events

__all__ = ["MIX", "Load"]

#: kind -> weight: the share of enqueue calls of each kind.
MIX: dict[str, int] = {
    "plain": 34,
    "delayed": 4,
    "flaky": 10,
    "doomed": 3,
    "flow": 5,
    "slow": 2,
    "mutex": 13,
    "capped": 13,
    "rated": 11,
    "both": 5,
}
FLOW_PARTS = 4
RETRYABLE = (trioq.InvalidJob, trioq.UnknownTask)  # a bad batch is the harness's bug: never resent


class Load:
    """The enqueuer, canceller and retrier of one run; ``acks`` and ``errors`` say what happened."""

    def __init__(self, producer: Any, rate: float, seed: int, out: Path, events: Events, slow: float = 20.0) -> None:
        self.producer = producer
        self.rate = rate
        self.slow = slow
        self.rng = random.Random(seed)
        self.events = events
        self._acks: IO[str] = (out / "acks.jsonl").open("a")
        self.acked = 0
        #: Jobs acknowledged already running: claimed by the enqueue itself for the enqueuing node's idle
        #: workers (PostgreSQL, ``feed="serve"``).
        self.running_at_ack = 0
        self.calls = 0
        self.resent = 0
        self.errors: Counter[str] = Counter()
        self.cancellable: deque[str] = deque(maxlen=200)
        self.doomed: deque[tuple[float, str]] = deque(maxlen=500)
        self._seq = 0

    def close(self) -> None:
        self._acks.close()

    def _specs(self, kind: str, n: int) -> tuple[list[trioq.JobSpec], list[str]]:
        """The batch for one enqueue call of ``kind``, and each spec's expected final state."""
        key = f"soak-{n}"
        spec = trioq.JobSpec
        if kind == "flow":
            parts = [spec("soak.part", {"flow": n, "i": i}, key=f"{key}-{i}") for i in range(FLOW_PARTS)]
            child = spec("soak.gather", {"flow": n, "parts": FLOW_PARTS}, key=f"{key}-g", after=list(range(FLOW_PARTS)))
            return [*parts, child], ["succeeded"] * (FLOW_PARTS + 1)
        if kind == "plain":
            return [spec("soak.plain", {"n": n, "ms": self.rng.randint(1, 20)}, key=key)], ["succeeded"]
        if kind == "delayed":
            return [spec("soak.plain", {"n": n}, key=key, delay=self.rng.uniform(0.5, 3.0))], ["succeeded"]
        if kind == "flaky":
            return [spec("soak.flaky", {"n": n, "fails": self.rng.randint(1, 2)}, key=key)], ["succeeded"]
        if kind == "doomed":
            return [spec("soak.doomed", {"n": n}, key=key)], ["dead"]
        if kind == "slow":
            seconds = self.rng.uniform(0.75, 1.25) * self.slow
            return [spec("soak.slow", {"n": n, "seconds": seconds}, key=key)], ["succeeded"]
        task = {"mutex": "soak.mutex", "capped": "soak.capped", "rated": "soak.rated", "both": "soak.both"}[kind]
        ms = {"mutex": 10, "capped": 60, "rated": 20, "both": 150}[kind]
        return [spec(task, {"n": n, "ms": self.rng.randint(ms // 2, ms * 2)}, key=key)], ["succeeded"]

    async def _send(self, specs: list[trioq.JobSpec]) -> list[trioq.Job]:
        """``enqueue_many`` until it answers; a retried call finds the jobs by their keys."""
        tries = 0
        while True:
            try:
                return list(await self.producer.enqueue_many(specs))
            except RETRYABLE:
                raise
            except Exception as exc:  # the outcome is unknown: counted, then sent again with the same keys
                self.errors[type(exc).__name__] += 1
                tries += 1
                self.resent += 1
                await trio.sleep(min(1.0, 0.05 * tries))

    async def enqueue(self, stop: trio.Event) -> None:
        """Until ``stop``: one call per ``1/rate`` s on a fixed schedule (a stalled call is caught up)."""
        kinds = list(MIX)
        weights = [MIX[k] for k in kinds]
        step = 1.0 / self.rate
        next_at = trio.current_time()
        while not stop.is_set():
            self._seq += 1
            kind = self.rng.choices(kinds, weights)[0]
            specs, expect = self._specs(kind, self._seq)
            jobs = await self._send(specs)
            self.calls += 1
            now = time.time()
            for job, want in zip(jobs, expect, strict=True):
                line: dict[str, Any] = {"job": job.id, "task": job.task, "key": job.key}
                line["max_attempts"] = job.max_attempts
                line["expect"] = want
                line.update(parents=list(job.after), t=now)
                self._acks.write(json.dumps(line) + "\n")
            self._acks.flush()
            self.acked += len(jobs)
            self.running_at_ack += sum(1 for job in jobs if job.state == trioq.JobState.RUNNING)
            if kind in ("slow", "delayed"):
                self.cancellable.append(jobs[0].id)
            elif kind == "doomed":
                self.doomed.append((now, jobs[0].id))
            next_at += step
            await trio.sleep_until(max(next_at, trio.current_time() - 1.0))

    async def cancel_and_retry(self, stop: trio.Event, every: float = 2.0) -> None:
        """Until ``stop``: every ``every`` s cancel a recent slow or delayed job, and retry a dead doomed one."""
        while not stop.is_set():
            await trio.sleep(every)
            if self.cancellable:
                job_id = self.cancellable[self.rng.randrange(len(self.cancellable))]
                self.events("cancel", job=job_id)
                await self._call("cancel", job_id)
            if self.doomed and time.time() - self.doomed[0][0] > 5.0:
                _, job_id = self.doomed.popleft()
                job = await self._call("get", job_id)
                if job is not None and job.state == trioq.JobState.DEAD:
                    done = await self._call("retry", job_id)
                    if done is None:  # refused, or done by a try whose answer was lost: the store says which
                        after = await self._call("get", job_id)
                        done = after if after is not None and after.state != trioq.JobState.DEAD else None
                    self.events("retry", job=job_id, ok=done is not None)

    async def _call(self, name: str, job_id: str) -> Any:
        """``producer.<name>(job_id)``, sent again while the store is unreachable; ``None`` if refused."""
        for tries in range(1, 200):
            try:
                return await getattr(self.producer, name)(job_id)
            except (trioq.InvalidJob, trioq.JobNotFound):
                return None
            except Exception as exc:
                self.errors[f"{name}:{type(exc).__name__}"] += 1
                await trio.sleep(min(1.0, 0.05 * tries))
        return None
