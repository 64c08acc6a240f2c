"""The dashboard (/ui) in a real browser: Debian's chromium driven by Playwright's sync API.

One live server for the module: a trio run in a background thread holding ``open_queue`` and
hypercorn on 127.0.0.1, with jobs in every state. Each test logs in with a fresh browser
context, fails on any console error or page error (a CSP violation is one), and saves a
screenshot of each page it visits to its tmp dir. Under ``CI`` a missing browser fails.
"""

from __future__ import annotations

import functools
import json
import os
import queue as thread_queue
import re
import shutil
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import attrs
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import trioq
from trioq import JobSpec, JobState
from trioq.http import create_app

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page

pytestmark = pytest.mark.slow

TOKEN = "ui-s3cret"
PAYLOAD_PROBE = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_T = TypeVar("_T")

# ------------------------------------------------------------------ the server

_failed_once: set[str] = set()


def _registry() -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task
    async def ok(ctx: trioq.JobContext, **payload: Any) -> dict[str, Any]:
        return {"echo": payload}

    @registry.task(max_attempts=1)
    async def flaky(ctx: trioq.JobContext) -> str:
        """Fails the first time it runs for a job, succeeds after (a retry)."""
        if ctx.job.id not in _failed_once:
            _failed_once.add(ctx.job.id)
            raise RuntimeError("<b>first attempt fails</b>")
        return "fine now"

    @registry.task
    async def hang(ctx: trioq.JobContext) -> None:
        await trio.sleep_forever()

    @registry.task(queue="held")
    async def later(ctx: trioq.JobContext) -> None:
        pass

    @registry.task(queue="mail")
    async def send(ctx: trioq.JobContext) -> None:
        pass

    return registry


@attrs.frozen
class Live:
    """The live server: its URL, the trio run's token (to call into it), the queue, and the ids of
    the jobs made for the tests by role."""

    url: str
    token: trio.lowlevel.TrioToken
    queue: trioq.Queue
    jobs: dict[str, str]

    def run(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """``await fn(*args)`` in the server's trio run, from the test's thread."""
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def state(self, role_or_id: str) -> JobState:
        return self.run(self.queue.get, self.jobs.get(role_or_id, role_or_id)).state


async def _until(queue: trioq.Queue, job_id: str, state: JobState) -> None:
    with trio.fail_after(10):
        while True:
            if (await queue.get(job_id)).state is state:
                return
            await trio.sleep(0.01)


async def _populate(queue: trioq.Queue) -> dict[str, str]:
    """Jobs in every state (the order matters: past max_ready=3 ready or scheduled, adds are deferred), and
    a dead and a running job of their own for the test that retries and cancels."""
    jobs: dict[str, str] = {}
    bulk = await queue.enqueue_many([JobSpec("ok", {"n": n}, tenant="bulk") for n in range(55)])
    jobs["bulk_newest"] = bulk[-1].id
    jobs["running"] = (await queue.enqueue("hang", tenant="acme")).id
    jobs["succeeded"] = (await queue.enqueue("ok", {"note": PAYLOAD_PROBE}, tenant="acme")).id
    jobs["dead"] = (await queue.enqueue("flaky")).id
    jobs["cancelled"] = (await queue.enqueue("ok", delay=3600)).id
    await queue.cancel(jobs["cancelled"])
    jobs["to_retry"] = (await queue.enqueue("flaky")).id
    jobs["to_cancel"] = (await queue.enqueue("hang")).id
    for role, state in [("running", "running"), ("to_cancel", "running"), ("dead", "dead"), ("to_retry", "dead")]:
        await _until(queue, jobs[role], JobState(state))
    await _until(queue, jobs["succeeded"], JobState.SUCCEEDED)
    await _until(queue, bulk[-1].id, JobState.SUCCEEDED)
    jobs["scheduled"] = (await queue.enqueue("ok", {"parent": True}, delay=3600)).id
    jobs["waiting"] = (await queue.enqueue("ok", {"child": True}, after=[jobs["scheduled"]])).id
    await queue.pause("held")
    jobs["ready"] = (await queue.enqueue("later")).id
    await queue.enqueue("later")
    jobs["deferred"] = (await queue.enqueue("ok", delay=3600)).id
    for role in ("scheduled", "waiting", "ready", "deferred"):
        assert (await queue.get(jobs[role])).state == role
    return jobs


def _serve(out: thread_queue.Queue[Any], stop: list[trio.Event]) -> None:
    async def main() -> None:
        async with trioq.open_queue(_registry(), workers=4, shutdown_grace=0, max_ready=3, overflow="defer") as queue:
            jobs = await _populate(queue)
            config = Config()
            config.bind = ["127.0.0.1:0"]
            config.accesslog = None
            config.graceful_timeout = 0.1
            stop.append(trio.Event())
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(
                    functools.partial(serve, create_app(queue, token=TOKEN), config, shutdown_trigger=stop[0].wait)
                )
                out.put(Live(binds[0], trio.lowlevel.current_trio_token(), queue, jobs))

    try:
        trio.run(main)
    except BaseException as exc:
        out.put(exc)
        raise


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    out: thread_queue.Queue[Any] = thread_queue.Queue()
    stop: list[trio.Event] = []
    thread = threading.Thread(target=_serve, args=(out, stop), daemon=True)
    thread.start()
    started = out.get(timeout=30)
    if isinstance(started, BaseException):
        raise started
    try:
        yield started
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=started.token)
        thread.join(15)
        assert not thread.is_alive()


# ----------------------------------------------------------------- the browser


def _no_browser(why: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"a browser is required under CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("playwright is not installed (pip install -e '.[dev]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        _no_browser("no chromium on PATH (apt-get install -y chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@attrs.define
class Tab:
    """A page in a fresh browser context, with what its console said and a screenshot folder."""

    page: Page
    url: str
    shots: Path
    problems: list[str] = attrs.Factory(list)
    confirm: bool = True  # how each confirm() dialog is answered
    expected: list[str] = attrs.Factory(list)  # console errors a step provokes on purpose (regexes)

    def go(self, path: str) -> None:
        self.page.goto(self.url + path)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=self.shots / f"ui-{name}.png", full_page=True)

    def log_in(self, token: str = TOKEN) -> None:
        self.go("/ui/login")
        self.page.fill("#token", token)
        self.page.click("button:has-text('Log in')")

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text()


@pytest.fixture
def tab(browser: Browser, live: Live, tmp_path: Path) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    opened = Tab(page, f"http://{live.url.removeprefix('http://')}", tmp_path)

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            opened.problems.append(f"console: {message.text}")

    page.on("console", console)
    page.on("pageerror", lambda error: opened.problems.append(f"pageerror: {error}"))
    page.on("dialog", lambda dialog: dialog.accept() if opened.confirm else dialog.dismiss())
    try:
        yield opened
        unexpected = [p for p in opened.problems if not any(re.search(e, p) for e in opened.expected)]
        assert unexpected == []
    finally:
        context.close()


# ------------------------------------------------------------------- the tests


def test_login_refuses_a_wrong_token_sets_a_strict_cookie_and_logs_out(tab: Tab) -> None:
    page = tab.page
    tab.go("/ui/jobs?state=dead")
    assert page.url.startswith(f"{tab.url}/ui/login")  # redirected: not logged in
    tab.shot("login")
    tab.expected.append(r"status of 401")  # the refused login answers 401
    tab.log_in("not-the-token")
    assert "Wrong token" in tab.text("main")
    assert page.context.cookies() == []
    tab.log_in()
    assert page.url == f"{tab.url}/ui"
    (cookie,) = page.context.cookies()
    assert cookie["name"] == "trioq_session" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ui" and TOKEN not in cookie["value"] and not cookie["secure"]  # http here
    page.click("button:has-text('Log out')")
    assert page.url.startswith(f"{tab.url}/ui/login")
    tab.go("/ui")
    assert page.url.startswith(f"{tab.url}/ui/login")  # the old cookie no longer opens the pages


def test_every_page_shows_jobs_in_every_state(tab: Tab, live: Live) -> None:
    page = tab.page
    tab.log_in()
    for state in JobState:
        assert int(page.locator(f"#state-counts [data-state={state.value}]").inner_text()) >= 1, state
    assert page.locator("#queues tr[data-queue=held]").inner_text().split()[4] == "2"  # 2 ready, paused
    assert "paused" in tab.text("#queues tr[data-queue=held]")
    assert "all healthy" in tab.text("main")

    page.click("#state-counts a:has-text('dead')")
    assert page.url.endswith("/ui/jobs?state=dead")
    assert {row.get_attribute("data-id") for row in page.locator("#jobs tbody tr").all()} >= {live.jobs["dead"]}
    assert set(page.locator("#jobs tbody tr .badge").all_inner_texts()) == {"dead"}
    page.select_option("select[name=state]", "")
    page.fill("input[name=tenant]", "bulk")
    page.click("button:has-text('Filter')")
    assert page.locator("#jobs tbody tr").count() == 50  # one page, newest first
    assert page.locator("#jobs tbody tr").first.get_attribute("data-id") == live.jobs["bulk_newest"]
    tab.shot("jobs")
    page.click("a:has-text('Older')")
    assert page.locator("#jobs tbody tr").count() == 5
    page.fill("input[name=tenant]", "")
    page.fill("input[name=task]", "later")
    page.click("button:has-text('Filter')")
    assert page.locator("#jobs tbody tr").count() == 2
    tab.expected.append(r"status of 400")  # a bad filter is a 400 page with the message
    tab.go("/ui/jobs?state=bogus")
    assert "state must be one of" in tab.text(".flash-error")

    tab.go(f"/ui/jobs/{live.jobs['waiting']}")
    assert "waiting" in tab.text("#job-state") and "waiting" in tab.text("#reasons")
    page.click(f"#parents a:has-text('{live.jobs['scheduled']}')")
    assert page.locator("#children a").all_inner_texts() == [live.jobs["waiting"]]
    tab.go(f"/ui/jobs/{live.jobs['dead']}")
    assert "attempt 1 failed" in tab.text("#timeline") and "created" in tab.text("#timeline")
    page.click("summary:has-text('Traceback')")
    assert "RuntimeError: <b>first attempt fails</b>" in tab.text(".traceback")
    tab.shot("job")

    # Last, so that the sampler has had its 3 s: the chart needs two samples of the totals.
    for _ in range(40):
        tab.go("/ui")
        if page.locator("svg.chart polyline").count():
            break
        page.wait_for_timeout(250)
    assert page.locator("svg.chart polyline.line-ok").count() == 1
    tab.shot("overview")


def test_retry_cancel_pause_and_resume_through_the_buttons(tab: Tab, live: Live) -> None:
    page = tab.page
    tab.log_in()
    tab.go(f"/ui/jobs/{live.jobs['ready']}")
    tab.confirm = False  # a declined confirm() posts nothing
    page.click("button:has-text('Cancel')")
    page.wait_for_timeout(200)
    assert live.state("ready") is JobState.READY and page.url == f"{tab.url}/ui/jobs/{live.jobs['ready']}"
    tab.confirm = True

    dead, running = live.jobs["to_retry"], live.jobs["to_cancel"]  # its own: the others keep theirs
    tab.go(f"/ui/jobs/{dead}")
    page.click("button:has-text('Retry')")  # confirm()ed by the dialog handler
    assert "again" in tab.text(".flash")
    live.run(_until, live.queue, dead, JobState.SUCCEEDED)
    tab.go(f"/ui/jobs/{dead}")
    assert tab.text("#job-state") == "succeeded" and '"fine now"' in tab.text("#result")
    assert page.locator("button:has-text('Retry')").count() == 0

    tab.go(f"/ui/jobs/{running}")
    assert "running" in tab.text("#job-state")
    page.click("button:has-text('Cancel')")
    assert tab.text("#job-state") == "cancelled" and live.state(running) is JobState.CANCELLED

    tab.go("/ui")
    page.click("#queues tr[data-queue=mail] button:has-text('Pause')")
    assert "Queue mail paused." in tab.text(".flash")
    assert live.run(live.queue.stats)["queues"]["mail"]["paused"]
    page.click("#queues tr[data-queue=mail] button:has-text('Resume')")
    assert "Queue mail resumed." in tab.text(".flash")
    assert "mail" not in live.run(live.queue.stats)["queues"]


def test_job_values_are_shown_as_text_never_run(tab: Tab, live: Live) -> None:
    page = tab.page
    tab.log_in()
    response = page.goto(f"{tab.url}/ui/jobs/{live.jobs['succeeded']}")
    assert response is not None
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert json.dumps(PAYLOAD_PROBE) in tab.text("#payload")  # as JSON text: quotes escaped
    assert page.evaluate("() => window.__xss") is None
    assert page.locator("main script, main img").count() == 0
    tab.go("/ui/jobs?task=flaky")
    assert page.locator("main b").count() == 0


def test_actions_without_the_csrf_token_are_refused(tab: Tab, live: Live) -> None:
    page = tab.page
    tab.log_in()  # the session cookie is there: only the token is missing
    target = f"{tab.url}/ui/jobs/{live.jobs['ready']}/cancel"
    for form in ({}, {"csrf": "guessed"}):
        refused = page.request.post(target, form=form, max_redirects=0)
        assert refused.status == 403 and "CSRF" in refused.text()
    refused = page.request.post(f"{tab.url}/ui/queues/pause", form={"queue": "held"}, max_redirects=0)
    assert refused.status == 403
    assert live.state("ready") is JobState.READY
