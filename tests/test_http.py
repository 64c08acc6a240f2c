"""The HTTP app through Quart's test client, on the autojump clock: every route, every error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from quart import Blueprint
from quart_trio import QuartTrio

import trioq
import trioq.testing
from trioq.http import blueprint, create_app

from .apps import make_registry

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def queue(autojump_clock: trio.testing.MockClock) -> AsyncIterator[trioq.Queue]:
    async with trioq.open_queue(make_registry(), workers=2, max_ready=5, shutdown_grace=0) as q:
        yield q


@pytest.fixture
async def client(queue: trioq.Queue) -> AsyncIterator[Any]:
    app = create_app(queue, token=TOKEN, max_body=2048)
    app.config["BACKGROUND_TASK_SHUTDOWN_TIMEOUT"] = 0.1
    async with app.test_app() as test_app:
        yield test_app.test_client()


async def test_health_and_readiness_need_no_token(client: Any, queue: trioq.Queue) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200 and (await response.get_json()) == {"status": "ok"}
    response = await client.get("/readyz")
    assert response.status_code == 200 and (await response.get_json())["ready"] is True


async def test_submit_poll_and_result(client: Any, queue: trioq.Queue) -> None:
    response = await client.post("/jobs", json={"task": "echo", "payload": {"text": "hi"}}, headers=AUTH)
    assert response.status_code == 202
    body = await response.get_json()
    assert body["state"] == "ready" and body["task"] == "echo" and body["payload"] == {"text": "hi"}
    await queue.wait(body["id"])
    response = await client.get(f"/jobs/{body['id']}", headers=AUTH)
    job = await response.get_json()
    assert response.status_code == 200 and job["state"] == "succeeded" and job["result"] == "hi"


async def test_batch_is_all_or_nothing(client: Any, queue: trioq.Queue) -> None:
    good = {"jobs": [{"task": "echo"}, {"task": "echo", "payload": {"text": "x"}, "priority": 3}]}
    response = await client.post("/jobs/batch", json=good, headers=AUTH)
    assert response.status_code == 202
    assert [j["state"] for j in (await response.get_json())["jobs"]] == ["ready", "ready"]
    before = (await queue.stats())["totals"]["enqueued"]
    for bad, field in [
        ({"jobs": [{"task": "echo"}, {"task": "nope"}]}, "jobs[1].task"),
        ({"jobs": [{"task": "echo"}, {"task": "echo", "delay": -1}]}, "jobs[1].delay"),
        ({"jobs": [{"task": "echo"}, {"payload": {}}]}, "jobs[1].task"),
        ({"jobs": [{"task": "echo", "colour": "red"}]}, "jobs[0].colour"),
        ({"jobs": []}, "jobs"),
        ({"jobs": "echo"}, "jobs"),
    ]:
        response = await client.post("/jobs/batch", json=bad, headers=AUTH)
        assert response.status_code == 400, bad
        assert (await response.get_json())["field"] == field
    assert (await queue.stats())["totals"]["enqueued"] == before


async def test_an_idempotency_key_answers_200_duplicate_and_409_for_another_task(
    client: Any, queue: trioq.Queue
) -> None:
    body = {"task": "slow", "key": "order-7", "delay": 100}
    first = await client.post("/jobs", json=body, headers=AUTH)
    assert first.status_code == 202 and (await first.get_json())["duplicate"] is False
    again = await client.post("/jobs", json=body, headers=AUTH)
    job = await again.get_json()
    assert again.status_code == 200 and job["duplicate"] is True and job["id"] == (await first.get_json())["id"]
    other = await client.post("/jobs", json={"task": "echo", "key": "order-7"}, headers=AUTH)
    assert other.status_code == 409
    error = await other.get_json()
    assert error["field"] == "key" and error["type"] == "InvalidJob" and "'slow'" in error["error"]
    batch = await client.post("/jobs/batch", json={"jobs": [body, body]}, headers=AUTH)
    assert batch.status_code == 200 and [j["duplicate"] for j in (await batch.get_json())["jobs"]] == [True, True]
    mixed = await client.post("/jobs/batch", json={"jobs": [body, {"task": "echo"}]}, headers=AUTH)
    assert mixed.status_code == 202 and [j["duplicate"] for j in (await mixed.get_json())["jobs"]] == [True, False]
    clash = await client.post("/jobs/batch", json={"jobs": [{"task": "echo", "key": "order-7"}]}, headers=AUTH)
    assert clash.status_code == 409 and (await clash.get_json())["field"] == "jobs[0].key"
    assert (await queue.stats())["totals"]["enqueued"] == 2


async def test_a_flow_over_http_waits_for_its_parents(client: Any, queue: trioq.Queue) -> None:
    slow = await queue.enqueue("slow", delay=50)
    response = await client.post(
        "/jobs", json={"task": "echo", "payload": {"text": "c"}, "after": [slow.id]}, headers=AUTH
    )
    assert response.status_code == 202
    child = await response.get_json()
    assert child["state"] == "waiting"
    response = await client.get(f"/jobs/{child['id']}", headers=AUTH)
    body = await response.get_json()
    assert body["after"] == [slow.id] and body["explain"][0]["kind"] == "waiting"
    # In a batch an integer names an earlier job of the same batch.
    batch = {"jobs": [{"task": "echo", "payload": {"text": "p"}}, {"task": "echo", "after": [0]}]}
    response = await client.post("/jobs/batch", json=batch, headers=AUTH)
    assert response.status_code == 202
    parent, second = (await response.get_json())["jobs"]
    done = await queue.wait(second["id"])
    assert done.state == "succeeded" and done.after == (parent["id"],)
    for bad in ({"after": ["no-such-job"]}, {"after": [0]}, {"after": "x"}):
        response = await client.post("/jobs", json={"task": "echo", **bad}, headers=AUTH)
        assert response.status_code == 400, bad
        assert (await response.get_json())["field"] == "after", bad
    await queue.cancel(slow.id)
    assert (await queue.wait(child["id"])).state == "cancelled"


async def test_list_jobs_pages_newest_first_and_bulk_actions_count(client: Any, queue: trioq.Queue) -> None:
    dead = [await queue.enqueue("boom") for _ in range(3)]
    slow = [await queue.enqueue("slow", delay=500) for _ in range(2)]
    await trio.sleep(1)
    pages, after = [], None
    while True:
        query = "/jobs?limit=2" + ("" if after is None else f"&after={after}")
        response = await client.get(query, headers=AUTH)
        assert response.status_code == 200
        body = await response.get_json()
        pages.append(len(body["jobs"]))
        if body["next"] is None:
            break
        assert body["next"] == body["jobs"][-1]["id"]
        after = body["next"]
    assert pages == [2, 2, 1]
    response = await client.get("/jobs?state=dead&task=boom", headers=AUTH)
    assert [job["id"] for job in (await response.get_json())["jobs"]] == [job.id for job in dead[::-1]]
    for query, field in [
        ("state=finished", "state"),
        ("limit=0", "limit"),
        ("limit=x", "limit"),
        ("limit=1001", "limit"),
        ("after=nope", "after"),
        ("colour=red", "colour"),
        ("state=dead&state=ready", "state"),
    ]:
        response = await client.get(f"/jobs?{query}", headers=AUTH)
        assert response.status_code == 400, query
        assert (await response.get_json())["field"] == field, query
    response = await client.post("/jobs/retry", json={"state": "ready"}, headers=AUTH)
    assert response.status_code == 400 and (await response.get_json())["field"] == "state"
    response = await client.post("/jobs/retry", json={"colour": "red"}, headers=AUTH)
    assert response.status_code == 400 and (await response.get_json())["field"] == "colour"
    await queue.pause("default")  # the retried jobs stay ready to be counted
    response = await client.post("/jobs/retry", json={"task": "boom", "limit": 2}, headers=AUTH)
    assert response.status_code == 200 and (await response.get_json()) == {"count": 2}
    assert (await queue.stats())["jobs"]["ready"] == 2
    response = await client.post("/jobs/cancel", headers=AUTH)  # no body: every unfinished job
    assert response.status_code == 200 and (await response.get_json()) == {"count": 4}
    assert [(await queue.get(job.id)).state.value for job in slow] == ["cancelled", "cancelled"]
    assert (await client.get("/jobs/retry", headers=AUTH)).status_code == 405


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "task"),
        ({"task": 5}, "task"),
        ({"task": "nope"}, "task"),
        ({"task": "echo", "payload": [1]}, "payload"),
        ({"task": "echo", "payload": {"nope": 1}}, "payload"),
        ({"task": "echo", "delay": "soon"}, "delay"),
        ({"task": "echo", "delay": True}, "delay"),
        ({"task": "echo", "priority": 1.5}, "priority"),
        ({"task": "echo", "priority": True}, "priority"),
        ({"task": "echo", "key": ""}, "key"),
        ({"task": "echo", "max_attempts": 0}, "max_attempts"),
        ({"task": "echo", "extra": 1}, "extra"),
    ],
)
async def test_bad_job_fields_are_400_naming_the_field(client: Any, body: dict[str, Any], field: str) -> None:
    response = await client.post("/jobs", json=body, headers=AUTH)
    assert response.status_code == 400
    data = await response.get_json()
    assert data["field"] == field and data["error"]


async def test_whole_number_floats_count_as_integers(client: Any, queue: trioq.Queue) -> None:
    response = await client.post("/jobs", json={"task": "echo", "priority": 3.0, "max_attempts": 2.0}, headers=AUTH)
    assert response.status_code == 202
    job = await queue.get((await response.get_json())["id"])
    assert job.priority == 3 and job.max_attempts == 2 and isinstance(job.priority, int)


async def test_malformed_json_and_non_object_bodies(client: Any) -> None:
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        response = await client.post("/jobs", data=raw, headers={**AUTH, "Content-Type": "application/json"})
        assert response.status_code == 400, raw
        assert "error" in await response.get_json()


async def test_body_over_the_limit_is_413(client: Any) -> None:
    big = {"task": "echo", "payload": {"text": "x" * 4096}}
    response = await client.post("/jobs", json=big, headers=AUTH)
    assert response.status_code == 413
    assert "over 2048 bytes" in (await response.get_json())["error"]


async def test_token_is_required_everywhere_but_health(client: Any) -> None:
    for method, path in [("GET", "/stats"), ("GET", "/metrics"), ("POST", "/jobs"), ("GET", "/jobs/x")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            response = await client.open(path, method=method, headers=headers, json={"task": "echo"})
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert (await response.get_json())["error"]


async def test_unknown_job_is_404_and_cancel_and_retry(client: Any, queue: trioq.Queue) -> None:
    response = await client.get("/jobs/nope", headers=AUTH)
    assert response.status_code == 404 and "nope" in (await response.get_json())["error"]
    assert (await client.delete("/jobs/nope", headers=AUTH)).status_code == 404
    assert (await client.post("/jobs/nope/retry", headers=AUTH)).status_code == 404

    slow = await queue.enqueue("slow", delay=50)
    response = await client.delete(f"/jobs/{slow.id}", headers=AUTH)
    assert response.status_code == 200 and (await response.get_json())["state"] == "cancelled"
    response = await client.post(f"/jobs/{slow.id}/retry", headers=AUTH)
    assert response.status_code == 200 and (await response.get_json())["state"] == "ready"
    await queue.cancel(slow.id)

    failed = await queue.enqueue("boom")
    await queue.wait(failed.id)
    response = await client.post(f"/jobs/{failed.id}/retry", headers=AUTH)
    assert response.status_code == 200 and (await response.get_json())["attempts"] == 0
    ready = await queue.enqueue("slow", delay=500)
    response = await client.post(f"/jobs/{ready.id}/retry", headers=AUTH)
    assert response.status_code == 409 and (await response.get_json())["field"] == "state"


async def test_pause_and_resume_a_named_queue(client: Any, queue: trioq.Queue) -> None:
    response = await client.post("/queues/email/pause", headers=AUTH)
    assert response.status_code == 200
    assert await response.get_json() == {"queue": "email", "paused": True, "changed": True}
    again = await client.post("/queues/email/pause", headers=AUTH)
    assert (await again.get_json())["changed"] is False
    held = await queue.enqueue("echo", {"text": "a"}, queue="email")
    free = await queue.enqueue("echo", {"text": "b"})
    await queue.wait(free.id)
    assert (await queue.get(held.id)).state == "ready"  # paused: not claimed
    body = await (await client.get(f"/jobs/{held.id}", headers=AUTH)).get_json()
    assert [reason["kind"] for reason in body["explain"]] == ["paused"] and body["state"] == "ready"
    stats = await (await client.get("/stats", headers=AUTH)).get_json()
    assert stats["queues"]["email"]["paused"] is True
    response = await client.post("/queues/email/resume", headers=AUTH)
    assert await response.get_json() == {"queue": "email", "paused": False, "changed": True}
    assert (await queue.wait(held.id)).state == "succeeded"
    response = await client.post("/queues/email/resume", headers=AUTH)
    assert (await response.get_json())["changed"] is False
    too_long = "q" * 256
    response = await client.post(f"/queues/{too_long}/pause", headers=AUTH)
    assert response.status_code == 400 and (await response.get_json())["field"] == "queue"
    assert (await client.post("/queues/email/pause")).status_code == 401
    assert (await client.get("/queues/email/pause", headers=AUTH)).status_code == 405


async def test_queue_full_is_503_with_retry_after(client: Any, queue: trioq.Queue) -> None:
    for _ in range(5):
        await queue.enqueue("slow", delay=100)
    response = await client.post("/jobs", json={"task": "echo"}, headers=AUTH)
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) >= 1
    assert "full" in (await response.get_json())["error"]


async def test_stats_and_metrics(client: Any, queue: trioq.Queue) -> None:
    job = await queue.enqueue("echo", {"text": "a"})
    await queue.wait(job.id)
    stats = await (await client.get("/stats", headers=AUTH)).get_json()
    assert stats["totals"]["succeeded"] == 1 and stats["jobs"]["succeeded"] == 1
    response = await client.get("/metrics", headers=AUTH)
    text = (await response.get_data()).decode()
    assert response.status_code == 200 and response.content_type.startswith("text/plain")
    assert 'trioq_jobs{state="succeeded"} 1.0' in text
    assert "trioq_succeeded_total 1.0" in text and "trioq_workers_healthy 2.0" in text
    assert 'trioq_run_seconds_count{task="echo"} 1.0' in text
    # Sub-millisecond buckets exist (how long this job waited depends on the machine's load).
    assert 'trioq_queue_wait_seconds_bucket{le="0.0005",task="echo"}' in text
    assert 'trioq_queue_wait_seconds_bucket{le="+Inf",task="echo"} 1.0' in text


async def test_unknown_routes_and_methods_answer_json(client: Any) -> None:
    response = await client.get("/nope", headers=AUTH)
    assert response.status_code == 404 and "error" in await response.get_json()
    response = await client.put("/jobs", headers=AUTH)
    assert response.status_code == 405 and "error" in await response.get_json()


async def test_readyz_is_503_while_no_worker_is_healthy(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(make_registry(), workers=0) as producer:
        app = create_app(producer)
        async with app.test_app() as test_app:
            response = await test_app.test_client().get("/readyz")
            assert response.status_code == 503
            body = await response.get_json()
            assert body["ready"] is False and "worker" in body["reason"]
            # Without a token, the other routes are open.
            assert (await test_app.test_client().get("/stats")).status_code == 200


async def test_blueprint_mounts_into_a_users_app(queue: trioq.Queue) -> None:
    app = QuartTrio("users-app")
    mine = Blueprint("mine", __name__)

    @mine.get("/hello")
    async def hello() -> str:
        return "hello"

    app.register_blueprint(mine)
    app.register_blueprint(blueprint(queue, token=TOKEN, max_body=64), url_prefix="/queue")
    async with app.test_app() as test_app:
        client = test_app.test_client()
        assert (await client.get("/hello")).status_code == 200
        response = await client.post("/queue/jobs", json={"task": "echo"}, headers=AUTH)
        assert response.status_code == 202
        big = await client.post("/queue/jobs", json={"task": "echo", "payload": {"text": "x" * 100}}, headers=AUTH)
        assert big.status_code == 413


# ------------------------------------------------------------ review fixes


@pytest.mark.parametrize("bad", ["", " ", "\t\n", "é", "tøken", "two words", "line\n", "\x00"])
async def test_an_unusable_token_is_refused_not_taken_as_no_auth(queue: trioq.Queue, bad: str) -> None:
    # token=None is "no authentication"; an empty or blank token is a mistake (an unset variable),
    # and a non-ASCII one cannot be sent the same way by every client: both refused up front.
    for make in (create_app, blueprint):
        with pytest.raises(ValueError, match="token=None"):
            make(queue, token=bad)
    with pytest.raises(TypeError, match="token must be a str"):
        create_app(queue, token=b"bytes")  # type: ignore[arg-type]
    # Printable ASCII works, sent as is.
    app = create_app(queue, token="A-z_0.9~+/=!")
    async with app.test_app() as test_app:
        response = await test_app.test_client().get("/stats", headers={"Authorization": "Bearer A-z_0.9~+/=!"})
    assert response.status_code == 200


async def test_405_says_which_methods_the_path_allows(client: Any) -> None:
    for method, path, allowed in [
        ("PUT", "/jobs", "GET, HEAD, POST"),
        ("GET", "/jobs/cancel", "POST"),
        ("DELETE", "/stats", "GET, HEAD"),
        ("POST", "/jobs/some-id", "DELETE, GET, HEAD"),
        ("GET", "/jobs/some-id/retry", "POST"),
    ]:
        response = await client.open(path, method=method, headers=AUTH)
        assert response.status_code == 405, (method, path)
        assert response.headers["Allow"] == allowed, (method, path)
        assert method in (await response.get_json())["error"]


async def test_jobs_batch_is_no_job_id(client: Any, queue: trioq.Queue) -> None:
    for method in ("GET", "DELETE"):
        response = await client.open("/jobs/batch", method=method, headers=AUTH)
        assert response.status_code == 405, method
        assert response.headers["Allow"] == "POST"
        assert "error" in await response.get_json()
    assert (await client.post("/jobs/batch/retry", headers=AUTH)).status_code == 404
    # Ids that merely start or end with "batch" are ids like any other.
    for job_id in ("batchy", "a-batch"):
        response = await client.get(f"/jobs/{job_id}", headers=AUTH)
        assert response.status_code == 404 and job_id in (await response.get_json())["error"]

    # Mounted in a host app, too (the host's own 405 page, with Allow).
    app = QuartTrio("host")
    app.register_blueprint(blueprint(queue), url_prefix="/q")
    async with app.test_app() as test_app:
        response = await test_app.test_client().get("/q/jobs/batch")
    assert response.status_code == 405 and "POST" in response.headers["Allow"]


async def test_a_lone_surrogate_in_a_key_is_400_naming_the_key(client: Any) -> None:
    raw = b'{"task": "echo", "key": "k\\udcff"}'  # valid JSON, but no store can hold the string
    response = await client.post("/jobs", data=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400, await response.get_data()
    assert (await response.get_json())["field"] == "key"


class Broken(RuntimeError):
    pass


async def _broken(*args: Any, **kwargs: Any) -> Any:
    raise Broken("secret detail /srv/app/db.sqlite")


def _broken_sync(*args: Any, **kwargs: Any) -> Any:
    raise Broken("secret detail /srv/app/db.sqlite")


def _assert_json_500(body: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert set(body) == {"error"} and "reference" in body["error"]
    assert "secret" not in body["error"] and "Traceback" not in body["error"]
    reference = body["error"].split("reference ")[1].split(")")[0]
    records = [r for r in caplog.records if r.name == "trioq.http" and reference in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in caplog.records]
    assert records[0].exc_info is not None and records[0].exc_info[0] is Broken


async def test_an_unexpected_error_is_a_logged_json_500(
    client: Any, queue: trioq.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(queue, "stats", _broken)
    monkeypatch.setattr(queue, "readiness", _broken_sync)
    for path in ("/stats", "/metrics", "/readyz"):
        response = await client.get(path, headers=AUTH)
        assert response.status_code == 500, path
        assert response.content_type == "application/json"
        _assert_json_500(await response.get_json(), caplog)
    # A trioq error that is no refusal (here the fault plan's crash) is a bug to the client, not a 503.
    monkeypatch.setattr(queue, "get", lambda job_id: _raise(trioq.testing.SimulatedCrash("injected")))
    response = await client.get("/jobs/x", headers=AUTH)
    assert response.status_code == 500 and "Retry-After" not in response.headers


async def _raise(exc: Exception) -> Any:
    raise exc


async def test_an_error_past_the_routes_is_a_json_500_too(queue: trioq.Queue, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(queue)

    @app.get("/added-by-the-user")
    async def added() -> str:
        raise Broken("secret")

    async with app.test_app() as test_app:
        response = await test_app.test_client().get("/added-by-the-user")
    assert response.status_code == 500 and response.content_type == "application/json"
    _assert_json_500(await response.get_json(), caplog)


async def test_the_blueprint_answers_json_500_in_a_host_app(
    queue: trioq.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = QuartTrio("host")  # no error handlers of ours here
    app.register_blueprint(blueprint(queue, token=TOKEN), url_prefix="/queue")
    monkeypatch.setattr(queue, "get", _broken)
    async with app.test_app() as test_app:
        response = await test_app.test_client().get("/queue/jobs/x", headers=AUTH)
    assert response.status_code == 500 and response.content_type == "application/json"
    _assert_json_500(await response.get_json(), caplog)


async def test_an_empty_job_id_in_a_path_is_no_redirect_to_a_bulk_action(client: Any, queue: trioq.Queue) -> None:
    """``POST /jobs//retry`` (a script's ``f"/jobs/{job_id}/retry"`` with an empty id) is a 404, not a
    308 to ``/jobs/retry``: a client following it (requests does, method and body kept) would retry every
    dead job. Likewise for cancel, and for the other job routes."""
    dead = await queue.enqueue("boom")
    await queue.wait(dead.id)
    for method, path in [
        ("POST", "/jobs//retry"),
        ("DELETE", "/jobs//"),
        ("GET", "/jobs//"),
    ]:
        response = await client.open(path, method=method, headers=AUTH)
        assert response.status_code == 404 and "Location" not in response.headers, (method, path)
        assert "error" in await response.get_json(), (method, path)
    assert (await queue.get(dead.id)).state is trioq.JobState.DEAD
