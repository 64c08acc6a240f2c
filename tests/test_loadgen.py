"""The loadgen's drain detection, against a fake ``/stats`` on the autojump clock."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest
import trio
import trio.testing

from trioq._app.console import CommandError
from trioq._app.loadgen import wait_drained


def _stats_server(jobs: int, rate: float, polls: list[float], *, status: int = 200) -> httpx.MockTransport:
    """A ``/stats`` whose queue drains ``rate`` jobs per second of trio time from now."""
    start = trio.current_time()

    def handler(request: httpx.Request) -> httpx.Response:
        now = trio.current_time()
        polls.append(now - start)
        left = max(0, jobs - int((now - start) * rate))
        body = {"jobs": {"ready": left, "scheduled": 0, "running": 0}, "totals": {}}
        if status != 200:
            body = {"error": "missing or wrong token"}
        return httpx.Response(status, content=json.dumps(body).encode())

    return httpx.MockTransport(handler)


async def test_polls_seldom_during_a_long_drain_and_often_near_its_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    polls: list[float] = []
    drain_s = 1000 / 100.0
    async with httpx.AsyncClient(transport=_stats_server(1000, 100.0, polls), base_url="http://t") as client:
        stats = await wait_drained(client, timeout=60, min_poll=0.005, max_poll=0.5)
    assert stats["jobs"]["ready"] == 0
    # Seen drained soon after the end, with far fewer polls than fixed 5 ms
    # pauses would take (2,000).
    assert drain_s <= polls[-1] <= drain_s + 0.011
    assert len(polls) < 60, len(polls)
    assert max(b - a for a, b in itertools.pairwise(polls)) <= 0.5 + 1e-9


async def test_a_refused_stats_request_is_an_error_not_a_wait(autojump_clock: trio.testing.MockClock) -> None:
    polls: list[float] = []
    transport = _stats_server(10, 1.0, polls, status=401)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        with pytest.raises(CommandError, match="401"):
            await wait_drained(client, timeout=60)
    assert len(polls) == 1


async def test_poll_bounds_are_checked() -> None:
    async with httpx.AsyncClient(base_url="http://t") as client:
        for low, high in ((0.0, 0.5), (-1.0, 0.5), (0.2, 0.1)):
            with pytest.raises(ValueError, match="min_poll"):
                await wait_drained(client, timeout=1, min_poll=low, max_poll=high)


async def test_a_queue_that_does_not_drain_in_time_is_an_error_saying_how_many_jobs_are_left(
    autojump_clock: trio.testing.MockClock,
) -> None:
    polls: list[float] = []
    async with httpx.AsyncClient(transport=_stats_server(1000, 1.0, polls), base_url="http://t") as client:
        with pytest.raises(CommandError, match=r"did not drain within 5s \(99\d jobs still ready"):
            await wait_drained(client, timeout=5)
