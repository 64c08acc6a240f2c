"""``trioq loadgen``: drive a running ``trioq serve`` over HTTP and report one JSON line."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import trio

from .console import CommandError

__all__ = ["LoadResult", "fetch_jobs", "loadgen", "submit", "wait_drained"]

#: Errors that mean "the server is not answering right now" (restarting, say).
_UNREACHABLE = (httpx.TransportError,)


class LoadResult:
    """What a load run saw: acknowledged ids with their submit times, and counters."""

    def __init__(self) -> None:
        self.acked: dict[str, float] = {}  # job id -> wall time its 202 arrived
        self.refused = 0  # 503s (full queue, shutting down): retried
        self.unreachable = 0  # transport errors: retried


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def submit(
    client: httpx.AsyncClient,
    jobs: list[dict[str, Any]],
    *,
    clients: int,
    batch: int,
    result: LoadResult,
    progress: Callable[[int], None] | None = None,
    deadline: float = math.inf,
) -> None:
    """Submit ``jobs`` from ``clients`` concurrent tasks, ``batch`` per request.

    A 503 or an unreachable server is retried (backing off briefly) until
    ``deadline`` (trio time); past it, or at any other error status, raises
    :class:`~trioq._app.console.CommandError` saying which.
    """
    chunks = [jobs[i : i + batch] for i in range(0, len(jobs), batch)]
    send, receive = trio.open_memory_channel[list[dict[str, Any]]](len(chunks))
    for chunk in chunks:
        send.send_nowait(chunk)
    send.close()

    async def one_client() -> None:
        async for chunk in receive:
            while True:
                if trio.current_time() > deadline:
                    raise CommandError("the server did not accept the jobs in time (see --timeout)")
                try:
                    if batch == 1:
                        response = await client.post("/jobs", json=chunk[0])
                    else:
                        response = await client.post("/jobs/batch", json={"jobs": chunk})
                except _UNREACHABLE:
                    result.unreachable += 1
                    await trio.sleep(0.05)
                    continue
                if response.status_code == 503:
                    result.refused += 1
                    await trio.sleep(min(float(response.headers.get("Retry-After", "1")), 0.2))
                    continue
                if response.status_code != 202:
                    answer = f"{response.status_code}: {response.text[:300]}"
                    raise CommandError(f"POST {response.url.path} answered {answer}")
                body = response.json()
                now = time.time()
                for job in [body] if batch == 1 else body["jobs"]:
                    result.acked[job["id"]] = now
                if progress is not None:
                    progress(len(chunk))
                break

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one_client)


async def wait_drained(
    client: httpx.AsyncClient, *, timeout: float, min_poll: float = 0.005, max_poll: float = 0.5
) -> dict[str, Any]:
    """Poll ``/stats`` until nothing is ready, scheduled or running; returns the stats.

    The pause between polls is half the time the rest should take at the
    average rate since the first poll (between ``min_poll`` and ``max_poll``):
    few requests while a long drain runs, each of which costs the server a
    wake-up in the middle of its jobs, and polls ``min_poll`` apart as the end
    nears, so a steady drain is seen about that late. One that speeds up
    (scheduled jobs coming due late) may be seen up to ``max_poll`` late.

    An error status, or ``timeout`` seconds without the drain, raises
    :class:`~trioq._app.console.CommandError` saying so.
    """
    if not 0 < min_poll <= max_poll:
        raise ValueError(f"need 0 < min_poll <= max_poll, got {min_poll!r} and {max_poll!r}")
    first: tuple[float, int] | None = None
    left = -1
    with trio.move_on_after(timeout):
        while True:
            pause = min_poll
            try:
                response = await client.get("/stats")
                if response.status_code != 200:
                    raise CommandError(f"GET /stats answered {response.status_code}: {response.text[:200]}")
                stats: dict[str, Any] = response.json()
                jobs = stats["jobs"]
                left = jobs["ready"] + jobs["scheduled"] + jobs["running"]
                if left == 0:
                    return stats
                now = trio.current_time()
                if first is None:
                    first = (now, left)
                elif first[1] > left:
                    rate = (first[1] - left) / (now - first[0])
                    pause = 0.5 * left / rate
                else:  # nothing finished since the first poll: no rate yet
                    pause = 4 * min_poll
            except _UNREACHABLE:
                pass
            await trio.sleep(min(max_poll, max(min_poll, pause)))
    still = f"{left} jobs still ready, scheduled or running" if left >= 0 else "the server did not answer"
    raise CommandError(f"the queue did not drain within {timeout:g}s ({still})")


async def fetch_jobs(client: httpx.AsyncClient, ids: list[str], *, clients: int) -> dict[str, dict[str, Any] | None]:
    """Every job by id (``None`` for ids the server does not know)."""
    found: dict[str, dict[str, Any] | None] = {}
    send, receive = trio.open_memory_channel[str](len(ids))
    for job_id in ids:
        send.send_nowait(job_id)
    send.close()

    async def one_client() -> None:
        async for job_id in receive:
            response = await client.get(f"/jobs/{job_id}")
            found[job_id] = response.json() if response.status_code == 200 else None

    async with trio.open_nursery() as nursery:
        for _ in range(max(1, clients)):
            nursery.start_soon(one_client)
    return found


def sim_jobs(n: int, work_ms: float, fail_prob: float, hang_prob: float) -> list[dict[str, Any]]:
    payload = {"work_ms": work_ms, "fail_prob": fail_prob, "hang_prob": hang_prob}
    return [{"task": "sim", "payload": payload} for _ in range(n)]


async def _totals_before(client: httpx.AsyncClient, url: str, token: str | None) -> dict[str, Any]:
    """The server's ``totals`` before the run; a server that cannot be reached, or refuses the token,
    or is no trioq serve, raises :class:`~trioq._app.console.CommandError` saying what to do."""
    try:
        response = await client.get("/stats")
    except httpx.TransportError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise CommandError(f"cannot reach {url} ({reason}): is trioq serve running there? Check --url") from None
    if response.status_code == 401:
        if token is None:
            raise CommandError("the server needs a bearer token: give --token or set TRIOQ_TOKEN")
        raise CommandError("the server refused the token: give the one trioq serve was started with")
    if response.status_code != 200:
        raise CommandError(f"GET {url}/stats answered {response.status_code}: {response.text[:200]}")
    try:
        totals: dict[str, Any] = response.json()["totals"]
    except (ValueError, KeyError, TypeError):
        raise CommandError(f"{url} does not answer GET /stats as trioq serve does: check --url") from None
    return totals


async def loadgen(args: Any) -> dict[str, Any]:
    """Run the load described by ``args`` and return the JSON-ready summary.

    ``args.token`` is the token to send (``None``: none). A server that is
    unreachable at the start, refuses the token, answers an error, takes
    longer than ``args.timeout`` seconds to accept the jobs or to drain them
    raises :class:`~trioq._app.console.CommandError`.
    """
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    jobs = sim_jobs(args.jobs, args.work_ms, args.fail_prob, args.hang_prob)
    result = LoadResult()
    bar = _Bar(args.jobs)
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=30.0, limits=limits) as client:
        before = await _totals_before(client, args.url, args.token)
        started = time.perf_counter()
        deadline = trio.current_time() + args.timeout
        await submit(
            client, jobs, clients=args.clients, batch=args.batch, result=result, progress=bar.advance, deadline=deadline
        )
        submit_s = time.perf_counter() - started
        stats = await wait_drained(client, timeout=args.timeout)
        total_s = time.perf_counter() - started
        bar.close()
        found = await fetch_jobs(client, list(result.acked), clients=args.clients)
    done = [j for j in found.values() if j is not None and j["state"] == "succeeded"]
    dead = [j for j in found.values() if j is not None and j["state"] == "dead"]
    latencies = [(j["finished_at"] - j["created_at"]) * 1000.0 for j in done]
    totals = stats["totals"]
    return {
        "jobs": args.jobs,
        "done": len(done),
        "dead": len(dead),
        "completion_pct": round(100.0 * len(done) / args.jobs, 3) if args.jobs else 100.0,
        "retried": totals["retried"] - before["retried"],
        "requeued": (totals["hung"] + totals["timed_out"]) - (before["hung"] + before["timed_out"]),
        "submit_s": round(submit_s, 4),
        "total_s": round(total_s, 4),
        "throughput_jobs_s": round(len(done) / total_s, 1) if total_s > 0 else 0.0,
        "latency_p50_ms": round(_percentile(latencies, 0.50), 3),
        "latency_p99_ms": round(_percentile(latencies, 0.99), 3),
    }


class _Bar:
    """A rich progress bar on stderr when it is a terminal; otherwise nothing."""

    def __init__(self, total: int) -> None:
        self._progress: Any = None
        if sys.stderr.isatty():
            try:
                from rich.progress import Progress
            except ImportError:  # rich is optional: no bar without it
                return
            self._progress = Progress(transient=True)
            self._task = self._progress.add_task("submitting", total=total)
            self._progress.start()

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def main(args: Any) -> int:
    summary = trio.run(loadgen, args)
    print(json.dumps(summary), flush=True)
    return 0
