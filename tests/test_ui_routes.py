"""The dashboard's routes through Quart's test client (no browser): sessions, cookies, CSRF, redirects,
headers, mounting under a prefix, the PostgreSQL nodes table, and the chart's arithmetic.
tests/test_ui.py drives the same pages in chromium."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from quart.typing import TestClientProtocol as Client
from quart_trio import QuartTrio

import trioq
from trioq._app.ui.history import History, chart, sample_forever
from trioq.http import blueprint, create_app

TOKEN = "t0ken"


def _registry() -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task(queue="mail")
    async def send(ctx: trioq.JobContext, to: str = "") -> None:
        pass

    return registry


@asynccontextmanager
async def _client(token: str | None = TOKEN, **options: Any) -> AsyncIterator[tuple[trioq.Queue, Client]]:
    async with trioq.open_queue(_registry(), workers=1, shutdown_grace=0, **options) as queue:
        app = create_app(queue, token=token)
        async with app.test_app() as test_app:
            yield queue, test_app.test_client()


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


async def _log_in(client: Client) -> None:
    response = await client.post("/ui/login", form={"token": TOKEN})
    assert response.status_code == 303


async def test_without_a_token_the_dashboard_is_open_but_actions_still_need_the_csrf_token() -> None:
    async with _client(token=None) as (queue, client):
        page = await client.get("/ui")
        assert page.status_code == 200
        cookie = page.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        assert (await client.post("/ui/queues/pause", form={"queue": "mail"})).status_code == 403
        csrf = _csrf(await page.get_data(as_text=True))
        done = await client.post("/ui/queues/pause", form={"queue": "mail", "csrf": csrf, "next": "/ui/jobs"})
        assert done.status_code == 303 and done.headers["Location"] == "/ui/jobs"
        assert (await queue.stats())["queues"]["mail"]["paused"]
        assert "Queue mail paused." in await (await client.get("/ui/jobs")).get_data(as_text=True)
        assert (await client.get("/ui/login")).headers["Location"] == "/ui"  # nothing to log in to


async def test_with_a_token_pages_need_the_cookie_and_the_api_still_needs_the_bearer_token() -> None:
    async with _client() as (queue, client):
        job = await queue.enqueue("send", delay=60)
        for path in ("/ui", "/ui/jobs", f"/ui/jobs/{job.id}"):
            response = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert response.status_code == 303 and response.headers["Location"].startswith("/ui/login?next=")
        anonymous = await client.post(f"/ui/jobs/{job.id}/cancel", form={"csrf": "x"})
        assert anonymous.status_code == 303 and anonymous.headers["Location"] == "/ui/login"
        wrong = await client.post("/ui/login", form={"token": TOKEN + "x"})
        assert wrong.status_code == 401 and "Set-Cookie" not in wrong.headers
        assert (await client.get("/ui/static/ui.css")).status_code == 200  # the login page's own
        await _log_in(client)
        assert (await client.get("/ui")).status_code == 200
        assert (await client.get("/stats")).status_code == 401  # the cookie is not an API credential
        secure = await client.post("/ui/login", form={"token": TOKEN}, scheme="https")
        assert "; Secure" in secure.headers["Set-Cookie"]
        csrf = _csrf(await (await client.get(f"/ui/jobs/{job.id}")).get_data(as_text=True))
        assert (await client.post("/ui/logout", form={"csrf": csrf})).headers["Location"] == "/ui/login"
        assert (await client.get("/ui")).status_code == 303  # the session is gone server-side


async def test_login_sends_you_back_inside_the_dashboard_only() -> None:
    async with _client() as (_queue, client):
        for given, expected in [
            ("/ui/jobs?state=dead", "/ui/jobs?state=dead"),
            ("https://evil.example/ui", "/ui"),
            ("//evil.example/ui", "/ui"),
            ("/uix", "/ui"),
            ("/stats", "/ui"),
        ]:
            response = await client.post("/ui/login", form={"token": TOKEN, "next": given})
            assert response.headers["Location"] == expected, given


async def test_a_next_that_no_header_can_carry_is_never_a_500() -> None:
    """``next`` is echoed into ``Location``: control characters (CR LF: a header injection; NUL: hypercorn
    refuses the response) send you to the overview, non-ASCII is percent-encoded, never a 500."""
    async with _client() as (_queue, client):
        for given, expected in [
            ("/ui/jobs\r\nSet-Cookie: a=b", "/ui"),
            ("/ui/jobs/\x00", "/ui"),
            ("/ui/jobs\x7f", "/ui"),
            ("/ui/jobs?task=\u00e9", "/ui/jobs?task=%C3%A9"),
            ("/ui/jobs/\u65e5?state=dead", "/ui/jobs/%E6%97%A5?state=dead"),
            ("/ui/jobs?task=a%20b", "/ui/jobs?task=a%20b"),
        ]:
            response = await client.post("/ui/login", form={"token": TOKEN, "next": given})
            assert response.status_code == 303 and response.headers["Location"] == expected, given
        page = await client.get("/ui")
        csrf = _csrf(await page.get_data(as_text=True))
        done = await client.post("/ui/queues/pause", form={"queue": "mail", "csrf": csrf, "next": "/ui/\r\nX: y"})
        assert done.status_code == 303 and done.headers["Location"] == "/ui"


async def test_pages_carry_a_strict_csp_and_refuse_odd_forms() -> None:
    async with _client() as (_queue, client):
        await _log_in(client)
        page = await client.get("/ui")
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
        assert "script-src 'self';" in page.headers["Content-Security-Policy"]
        assert page.headers["X-Frame-Options"] == "DENY" and page.headers["Cache-Control"] == "no-store"
        html = await page.get_data(as_text=True)
        assert "<script>" not in html and " style=" not in html  # no inline script or style anywhere
        assert (await client.get("/ui/static/nope.js")).status_code == 404
        json_body = await client.post("/ui/queues/pause", json={"queue": "mail"})
        assert json_body.status_code == 415
        huge = await client.post("/ui/queues/pause", form={"queue": "m" * 20_000})
        assert huge.status_code == 413
        assert (await client.post("/ui/queues/pause", form={f"f{n}": "" for n in range(30)})).status_code == 400
        assert (await client.get("/ui/jobs/no-such-job")).status_code == 404
        bad = await client.get("/ui/jobs?state=nope")
        assert bad.status_code == 400 and "state must be one of" in await bad.get_data(as_text=True)


async def test_a_host_app_mounts_the_dashboard_under_its_prefix() -> None:
    async with trioq.open_queue(_registry(), workers=1, shutdown_grace=0) as queue:
        app = QuartTrio("host")
        app.register_blueprint(blueprint(queue, token=TOKEN), url_prefix="/trioq")
        async with app.test_app() as test_app:
            client = test_app.test_client()
            assert (await client.get("/trioq/ui")).headers["Location"] == "/trioq/ui/login?next=/trioq/ui"
            response = await client.post("/trioq/ui/login", form={"token": TOKEN})
            assert response.headers["Location"] == "/trioq/ui" and "Path=/trioq/ui" in response.headers["Set-Cookie"]
            html = await (await client.get("/trioq/ui")).get_data(as_text=True)
            assert 'href="/trioq/ui/jobs"' in html and 'src="/trioq/ui/static/ui.js"' in html


def test_the_chart_needs_two_samples_and_never_draws_a_negative_rate() -> None:
    history = History(keep=3)
    history.add(100.0, {"succeeded": 0, "failed_attempts": 0})
    assert chart(history, now=100.0) is None
    history.add(102.0, {"succeeded": 10, "failed_attempts": 2})
    history.add(104.0, {"succeeded": 1, "failed_attempts": 0})  # the queue was opened again
    history.add(106.0, {"succeeded": 5, "failed_attempts": 1})
    assert len(history.samples) == 3  # a ring: the oldest went
    assert [(s.succeeded_per_s, s.failed_per_s) for s in history.steps()] == [(0.5, 0.0), (2.0, 0.5)]
    drawn = chart(history, now=106.0)
    assert drawn is not None and drawn.y_max == 2.0 and drawn.failure_rate == pytest.approx(1 / 6)
    assert drawn.succeeded_per_s == 5 / 4  # 1 + 4 succeeded over 4 s
    assert drawn.succeeded_points.count(",") == 2


async def test_the_overview_lists_the_nodes_of_a_postgres_store(pg_dsn: str) -> None:
    from trioq.stores.postgres import PostgresStore

    async with _client(token=None, store=PostgresStore(pg_dsn)) as (queue, client):
        await queue.enqueue("send")
        await queue.join()  # a claim writes this node's lease row
        html = await (await client.get("/ui")).get_data(as_text=True)
        assert f"<code>{queue.node}</code> (this one)" in html


async def test_sampling_outlives_an_error_of_stats(autojump_clock: Any) -> None:
    """The chart's sampler runs in the serving app's nursery: an unexpected error of ``stats()`` (a pool
    timeout, a bug) is logged and sampling goes on, rather than ending the app with it; a closed queue's
    TrioqError ends sampling quietly."""

    class Flaky:
        def __init__(self) -> None:
            self.calls = 0

        async def stats(self) -> dict[str, Any]:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("the pool timed out")
            if self.calls == 5:
                raise trioq.TrioqError("the queue is closed")
            return {"totals": {"succeeded": self.calls, "failed_attempts": 0}}

    history = History()
    await sample_forever(Flaky(), history, every=1.0)  # type: ignore[arg-type]
    assert [totals["succeeded"] for _, totals in history.samples] == [1, 3, 4]
