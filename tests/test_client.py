"""trioq.client against a live HTTP server on 127.0.0.1 (hypercorn in the test's nursery): AsyncClient under
trio and under asyncio, Client (sync) from a thread; every call, and the trioq errors they raise."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import trioq
from trioq import JobSpec, JobState
from trioq.client import AsyncClient, Client
from trioq.http import create_app

pytestmark = pytest.mark.slow

TOKEN = "s3cret"


def _registry() -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task
    async def add(ctx: trioq.JobContext, a: int, b: int) -> int:
        return a + b

    @registry.task(max_attempts=1)
    async def fail(ctx: trioq.JobContext) -> None:
        raise RuntimeError("no")

    @registry.task
    async def total(ctx: trioq.JobContext) -> int:
        return sum(ctx.parents.values())

    @registry.task
    async def sleepy(ctx: trioq.JobContext) -> None:
        await trio.sleep(3600)

    return registry


@asynccontextmanager
async def live_server(**options: object) -> AsyncIterator[tuple[trioq.Queue, str]]:
    """A queue behind its HTTP app, served on 127.0.0.1 and a free port; its address."""
    async with trioq.open_queue(_registry(), workers=4, shutdown_grace=0, **options) as queue:  # type: ignore[arg-type]
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.graceful_timeout = 0.1
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            app = create_app(queue, token=TOKEN)
            binds = await nursery.start(functools.partial(serve, app, config, shutdown_trigger=stop.wait))
            yield queue, binds[0]
            stop.set()


async def exercise(client: AsyncClient) -> None:
    """Every call of an AsyncClient (whichever loop runs it)."""
    job = await client.enqueue("add", {"a": 2, "b": 3}, priority=5, tenant="acme")
    assert isinstance(job, trioq.Job) and job.task == "add" and job.priority == 5 and job.tenant == "acme"
    done = await client.wait(job.id, timeout=10)
    assert done.state is JobState.SUCCEEDED and done.result == 5
    flow = await client.enqueue_many(
        [JobSpec("add", {"a": 1, "b": 1}), JobSpec("add", {"a": 2, "b": 2}), JobSpec("total", after=[0, 1])]
    )
    assert flow[2].state is JobState.WAITING and flow[2].after == (flow[0].id, flow[1].id)
    assert (await client.wait(flow[2].id, timeout=10)).result == 6
    assert flow.existing == frozenset()
    dead = await client.wait((await client.enqueue("fail")).id, timeout=10)
    assert dead.state is JobState.DEAD and dead.errors[0].error == "RuntimeError: no"
    assert (await client.retry(dead.id)).state is JobState.READY
    with pytest.raises(trioq.InvalidJob) as excinfo:
        await client.retry(done.id)
    assert excinfo.value.field == "state"
    sleeping = await client.enqueue("sleepy", delay=600)
    assert (await client.cancel(sleeping.id)).state is JobState.CANCELLED
    listed = await client.list(task="add", state="succeeded")
    assert [j.id for j in listed] == [flow[1].id, flow[0].id, job.id]
    assert [j.id for j in await client.list(task="add", limit=1, after_id=flow[1].id)] == [flow[0].id]
    assert (await client.stats())["jobs"]["cancelled"] == 1
    assert await client.retry_many(state="cancelled") == 1
    assert await client.cancel_many(task="sleepy") == 1
    with pytest.raises(trioq.InvalidJob) as excinfo:
        await client.retry_many(state="ready")
    assert excinfo.value.field == "state"
    with pytest.raises(trioq.UnknownTask):
        await client.enqueue("nope")
    with pytest.raises(trioq.InvalidJob) as excinfo:
        await client.enqueue("add", {"a": 1, "b": 2}, delay=-1)
    assert excinfo.value.field == "delay"
    with pytest.raises(trioq.JobNotFound):
        await client.get("no-such-job")
    with pytest.raises(trioq.WaitTimeout):
        await client.wait((await client.enqueue("sleepy")).id, timeout=0.1)
    once = JobSpec("add", {"a": 1, "b": 1}, key="once")
    again = await client.enqueue_many([once, JobSpec("add", {"a": 0, "b": 0})])
    twice = await client.enqueue_many([once, JobSpec("add", {"a": 0, "b": 0})])
    assert again.existing == frozenset() and twice.existing == {0}  # as Queue.enqueue_many's Added
    assert twice[0].id == again[0].id and twice[1].id != again[1].id


async def test_async_client_under_trio() -> None:
    async with live_server() as (_queue, url), AsyncClient(url, token=TOKEN) as client:
        with trio.fail_after(30):
            await exercise(client)


async def test_async_client_under_asyncio() -> None:
    async def main(url: str) -> None:
        async with AsyncClient(url, token=TOKEN) as client:
            await asyncio.wait_for(exercise(client), 30)

    async with live_server() as (_queue, url):
        await trio.to_thread.run_sync(asyncio.run, main(url))


async def test_sync_client_from_a_thread_and_the_errors_of_a_first_hour() -> None:
    def use(url: str) -> None:
        with Client(url, token=TOKEN) as client:
            job = client.enqueue("add", {"a": 20, "b": 22})
            assert client.wait(job.id, timeout=10).result == 42
            assert client.get(job.id).state is JobState.SUCCEEDED
            with pytest.raises(trioq.QueueFull) as full:
                for _ in range(5):
                    client.enqueue("sleepy", delay=600)
            assert full.value.retry_after > 0
            assert client.cancel(client.list(state="scheduled")[0].id).state is JobState.CANCELLED
        with Client(url, token="wrong") as stranger, pytest.raises(trioq.TrioqError, match="token"):
            stranger.stats()

    async with live_server(max_ready=3) as (_queue, url):
        with trio.fail_after(30):
            await trio.to_thread.run_sync(use, url)
    with Client(url) as client, pytest.raises(trioq.TrioqError, match="cannot reach"):
        client.stats()  # the server is gone
    with pytest.raises(ValueError, match="http"):
        Client("127.0.0.1:8000")


def _answering(status: int, body: bytes, seen: list[httpx.Request] | None = None) -> httpx.MockTransport:
    """A transport whose server answers every request ``status`` with ``body`` (JSON's content type)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=body, headers={"Content-Type": "application/json"})

    return httpx.MockTransport(handle)


def test_a_server_answering_garbage_is_a_trioq_error() -> None:
    """Whatever a server (or a proxy in front of it) answers, a call returns what it says or raises a
    TrioqError naming the server: never a KeyError, a ValueError or a JSONDecodeError of the client's."""
    calls: list[tuple[str, tuple[object, ...]]] = [
        ("get", ("j-1",)),
        ("cancel", ("j-1",)),
        ("retry", ("j-1",)),
        ("enqueue", ("add",)),
        ("enqueue_many", ([JobSpec("add")],)),
        ("list", ()),
        ("retry_many", ()),
        ("cancel_many", ()),
        ("stats", ()),
        ("wait", ("j-1", 1.0)),
    ]
    for status, body in [
        (200, b"<html>a proxy's page</html>"),
        (200, b"[1, 2]"),
        (200, b'{"ok": true}'),
        (200, b'{"jobs": "none", "count": "many", "id": 5, "state": "odd"}'),
        (200, b'{"jobs": [{"id": "x"}], "count": null}'),
        (202, b"null"),
        (503, b'{"error": "full", "type": "QueueFull", "retry_after": "soon"}'),
        (400, b'{"error": "bad", "type": "InvalidJob", "field": 5}'),
    ]:
        with Client("http://trioq.test", transport=_answering(status, body)) as client:
            for name, args in calls:
                try:
                    getattr(client, name)(*args)
                except trioq.TrioqError as exc:
                    assert type(exc) in (trioq.TrioqError, trioq.QueueFull, trioq.InvalidJob), (name, body, exc)
                    if isinstance(exc, trioq.QueueFull):
                        assert exc.retry_after == 1.0
                    if isinstance(exc, trioq.InvalidJob):
                        assert exc.field is None
                else:
                    assert name == "stats" and body.startswith(b"{"), (name, body)


async def test_async_client_a_server_answering_garbage_is_a_trioq_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=b"<html></html>"))
    async with AsyncClient("http://trioq.test", transport=transport) as client:
        for call in (client.get("j-1"), client.list(), client.retry_many(), client.stats()):
            with pytest.raises(trioq.TrioqError, match=r"trioq\.test"):
                await call


def test_an_id_is_one_path_segment_whatever_it_holds() -> None:
    """A job id of dots is sent escaped: ``retry(".")`` is no ``POST /jobs/./retry``, which an HTTP
    client's dot-segment removal makes ``POST /jobs/retry`` (retry_many: every dead job). An id no path
    segment or request can carry (a ``/``, a lone surrogate) names no job (JobNotFound, as Queue.get
    answers); a filter holding a lone surrogate is InvalidJob naming it."""
    seen: list[httpx.Request] = []
    transport = _answering(404, b'{"error": "no such job", "type": "JobNotFound"}', seen)
    with Client("http://trioq.test", transport=transport) as client:
        for job_id in (".", "..", "a.b"):
            for call in (client.get, client.cancel, client.retry):
                with pytest.raises(trioq.JobNotFound):
                    call(job_id)
        assert [request.url.raw_path for request in seen[:3]] == [b"/jobs/%2E", b"/jobs/%2E", b"/jobs/%2E/retry"]
        assert all(request.url.raw_path.startswith((b"/jobs/%2E", b"/jobs/a%2Eb")) for request in seen)
        seen.clear()
        for job_id in ("a/b", "\udcff"):
            for call in (client.get, client.cancel, client.retry):
                with pytest.raises(trioq.JobNotFound):
                    call(job_id)
        assert seen == []
        with pytest.raises(trioq.InvalidJob) as excinfo:
            client.list(after_id="\udcff")
        assert excinfo.value.field == "after_id"


def test_a_bad_url_or_token_is_a_value_error_at_once() -> None:
    for url in ("127.0.0.1:8000", "http://[::1", "http://a:b", "http://a\x00b/"):
        with pytest.raises(ValueError, match="url"):
            Client(url)
    for token in ("", "a b", "\u00e9", "a\nb", "\udcff"):
        with pytest.raises(ValueError, match="token"):
            Client("http://127.0.0.1:8000", token=token)
