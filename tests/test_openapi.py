"""trioq.http against its own OpenAPI document.

The document served at /openapi.json must be valid and describe every route.
Then schemathesis generates requests (valid and invalid) for each operation;
they go through Quart's test client to an app on a live queue, inside trio (the
schemathesis ASGI transport runs apps on its own asyncio loop, which a
Quart-Trio app and a trio queue cannot share). No answer may be a 5xx other
than the documented 503, and each must match its documented status code,
content type, headers and body schema.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import jsonschema_rs
import pytest
import requests
import schemathesis
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from quart_trio import QuartTrio
from schemathesis import Case, GenerationMode
from schemathesis import Response as CheckedResponse
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import trioq
from trioq._app.openapi import openapi_spec
from trioq._model import INT64_MAX, INT_MAX, INT_MIN, MAX_NAME_BYTES
from trioq.http import blueprint, create_app

from .apps import make_registry

TOKEN = "s3cret"
AUTH = f"Bearer {TOKEN}"
MAX_READY = 4
MAX_BODY = 16 * 1024
BASE_URL = "http://testserver"
SCHEMA = schemathesis.openapi.from_dict(openapi_spec())
OPERATIONS = [(op.path, op.method.upper()) for op in (result.ok() for result in SCHEMA.get_all_operations())]
OPEN_ROUTES = {"/healthz", "/readyz", "/openapi.json"}


TASKS = ["echo", "boom", "slow"]


# ------------------------------------------------------------- the document


async def test_served_document_is_openapi_spec_and_valid() -> None:
    async with trioq.open_queue(make_registry(), workers=1, shutdown_grace=0) as queue:
        app = create_app(queue, token=TOKEN)
        async with app.test_app() as test_app:
            response = await test_app.test_client().get("/openapi.json")  # open even with a token
            assert response.status_code == 200 and response.content_type == "application/json"
            served = await response.get_json()
    assert served == openapi_spec()
    assert openapi_spec() is openapi_spec()  # built once
    assert served["openapi"] == "3.1.0" and served["info"]["version"] == trioq.__version__
    loaded = schemathesis.openapi.from_dict(served)
    loaded.validate()  # against the OpenAPI 3.1 meta-schema
    assert all(result.ok() for result in loaded.get_all_operations())


async def test_every_route_is_described_and_nothing_else() -> None:
    async with trioq.open_queue(make_registry(), workers=0) as queue:
        app = create_app(queue)
    served: set[tuple[str, str]] = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("trioq.trioq_ui."):  # the dashboard is HTML
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        served.update((path, method) for method in rule.methods or () if method not in {"HEAD", "OPTIONS"})
    documented = {(path, method.upper()) for path, item in openapi_spec()["paths"].items() for method in item}
    assert served == documented


def test_security_applies_to_all_but_the_open_routes() -> None:
    spec = openapi_spec()
    assert spec["security"] == [{"bearerAuth": []}]
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    for path, item in spec["paths"].items():
        for operation in item.values():
            responses = operation["responses"]
            if path in OPEN_ROUTES:
                assert operation["security"] == [] and "401" not in responses
            else:
                assert "security" not in operation and "401" in responses
            assert "413" in responses
            for code in ("400", "404", "409", "503"):
                if code in responses and path != "/readyz":
                    resolved = responses[code]
                    if "$ref" in resolved:
                        resolved = spec["components"]["responses"][resolved["$ref"].rsplit("/", 1)[1]]
                    assert resolved["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
                    assert (code == "503") == ("Retry-After" in resolved.get("headers", {}))


# ---------------------------------------------------------- generated cases


async def _run_queue(stop: trio.Event, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    # A long grace: leaving the block with a job running keeps the queue draining until cancelled.
    async with trioq.open_queue(make_registry(), workers=2, max_ready=MAX_READY, shutdown_grace=3600) as queue:
        task_status.started(queue)
        await stop.wait()


@asynccontextmanager
async def serving(state: str) -> AsyncIterator[tuple[Any, list[str]]]:
    """A test client of an app on a live queue in ``state``, and the ids of jobs in each state.

    ``open`` has room; ``full`` holds ``max_ready`` pending jobs (enqueues get 503);
    ``draining`` is shutting down with a job still running (enqueues and retries get 503).
    """
    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        queue: trioq.Queue = await nursery.start(_run_queue, stop)
        succeeded = await queue.enqueue("echo", {"text": "hi"}, key="known")
        dead = await queue.enqueue("boom")
        cancelled = await queue.enqueue("slow", delay=1000)
        await queue.cancel(cancelled.id)
        scheduled = await queue.enqueue("slow", delay=1000)
        running = await queue.enqueue("slow")
        await queue.wait(succeeded.id)
        await queue.wait(dead.id)
        await trio.testing.wait_all_tasks_blocked()  # a worker has claimed `running` and sleeps in it
        assert (await queue.get(running.id)).state is trioq.JobState.RUNNING
        if state == "full":
            for _ in range(MAX_READY - 1):
                await queue.enqueue("slow", delay=1000)
        elif state == "draining":
            stop.set()  # the queue block ends, and waits for `running` (a long grace) until cancelled
            await trio.testing.wait_all_tasks_blocked()
            assert queue.readiness() == (False, "the queue is shutting down")
        ids = [job.id for job in (succeeded, dead, cancelled, scheduled, running)]
        app = create_app(queue, token=TOKEN, max_body=MAX_BODY)
        async with app.test_app() as test_app:
            yield test_app.test_client(), ids
        nursery.cancel_scope.cancel()


def _has_inputs(path: str, method: str) -> bool:
    return "{" in path or method == "POST"


def _job(draw: Any, job: Any, ids: list[str]) -> Any:
    """Point a generated job object at a real task with a payload it takes, so the enqueue can succeed."""
    if isinstance(job, dict):
        task = job["task"] = draw(st.sampled_from(TASKS))
        payloads = [{}, None, {"text": "x"}] if task == "echo" else [{}, None]
        job["payload"] = draw(st.sampled_from(payloads))
        if draw(st.sampled_from([False, False, False, True])):
            job["key"] = "known"  # held by a succeeded job: returned as is, even when the queue is full
        # The document bounds names in characters, the store in bytes, and only the registry knows
        # the limit keys: steer these to values the app must take.
        for name, values in (
            ("queue", [None, "default", "email"]),
            ("tenant", [None, "acme"]),
            ("limits", [None, [], ["shared"], ["user:7", "shared"]]),
            ("after", [None, [], [ids[0]], ids[:2]]),  # parents the queue knows (succeeded, dead: both take)
        ):
            if name in job:
                job[name] = draw(st.sampled_from(values))
    return job


def _adjust(case: Case, draw: Any, ids: list[str]) -> bool:
    """Steer most positive cases to what random data rarely hits: existing jobs, real tasks, good payloads.

    Returns whether it did: a steered case is valid for the app as well as for the document (the
    document cannot know the registry's tasks or their payloads), so the app must accept it.
    """
    if not draw(st.sampled_from([True, True, True, False])):
        return False
    if "job_id" in case.path_parameters:
        case.path_parameters = {"job_id": draw(st.sampled_from(ids))}
    body = case.body
    if case.path == "/jobs" and case.method.upper() == "GET":
        # A page starts from a job the queue holds: an id it never had is a 400.
        query = dict(case.query or {})
        query.pop("after", None)
        after = draw(st.sampled_from([None, *ids]))
        if after is not None:
            query["after"] = after
        case.query = query
    elif case.path in ("/jobs/retry", "/jobs/cancel") and isinstance(body, dict):
        # Each action takes its own states only (retry: dead or cancelled; cancel: unfinished ones).
        states = ["dead", "cancelled"] if case.path == "/jobs/retry" else ["ready", "scheduled", "running", "waiting"]
        body.pop("state", None)
        state = draw(st.sampled_from([None, *states]))
        case.body = body if state is None else {**body, "state": state}
    elif case.path == "/jobs":
        case.body = _job(draw, body, ids)
    elif case.path == "/jobs/batch" and isinstance(body, dict) and isinstance(body.get("jobs"), list):
        jobs = body["jobs"][: draw(st.sampled_from([1, 2, 3, len(body["jobs"])]))] or body["jobs"]
        case.body = {**body, "jobs": [_job(draw, job, ids) for job in jobs]}
    return True


async def _send(client: Any, case: Case, authorization: str | None) -> CheckedResponse:
    kwargs = case.as_transport_kwargs(base_url=BASE_URL)
    headers = dict(kwargs.get("headers") or {})
    headers.pop("Authorization", None)
    if authorization is not None:
        headers["Authorization"] = authorization
    request = requests.Request(
        method=kwargs["method"],
        url=kwargs["url"],
        headers=headers,
        params=kwargs.get("params"),
        json=kwargs.get("json"),
        data=kwargs.get("data"),
    ).prepare()
    body = request.body.encode() if isinstance(request.body, str) else request.body
    response = await client.open(
        request.path_url, method=request.method, headers=dict(request.headers), data=body or b""
    )
    answer_headers: dict[str, list[str]] = {}
    for name, value in response.headers.items():
        answer_headers.setdefault(name.lower(), []).append(value)
    return CheckedResponse(
        status_code=response.status_code,
        headers=answer_headers,
        content=await response.get_data(),
        request=request,
        elapsed=0.0,
        verify=True,
    )


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
@settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    # No shrinking: every example opens a queue, so shrinking a big body can take minutes. A failure
    # still shows the drawn state and auth, and the check failure a curl command reproducing the request.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
@given(data=st.data())
async def test_no_server_errors_and_answers_match_the_document(path: str, method: str, data: Any) -> None:
    operation = SCHEMA[path][method]
    modes = [GenerationMode.POSITIVE]
    if _has_inputs(path, method):
        modes.append(GenerationMode.NEGATIVE)
    state = data.draw(st.sampled_from(["open", "open", "full", "draining"]), label="state")
    authorization = data.draw(st.sampled_from([AUTH] * 9 + [None, "Bearer wrong", f"Basic {TOKEN}"]), label="auth")
    # The Authorization header is fixed, so negative cases never "negate" it behind our back.
    headers = {} if authorization is None else {"Authorization": authorization}
    mode = data.draw(st.sampled_from(modes), label="mode")
    case = data.draw(operation.as_strategy(mode, headers=headers), label="case")
    async with serving(state) as (client, ids):
        steered = mode is GenerationMode.POSITIVE and _adjust(case, data.draw, ids)
        response = await _send(client, case, authorization)
    event(f"{mode.value}, {state}: {response.status_code}")  # see pytest --hypothesis-show-statistics
    assert response.status_code < 500 or response.status_code == 503, (response.status_code, response.content)
    if authorization != AUTH and path not in OPEN_ROUTES:
        # Routing answers first: a path no route takes (404 "no route") or a method it does not serve (405).
        routing = response.status_code == 405 or (response.status_code == 404 and b"no route" in response.content)
        assert response.status_code in {401, 413} or routing, response.status_code
    checks = [
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
    ]
    # Invalid data must be rejected, but 413 (too big to read) is a rejection schemathesis does not count,
    # and a draining queue answers 503 before it looks at a body.
    if response.status_code not in {413, 503}:
        checks.append(negative_data_rejection)
    # And valid data accepted: a steered case is one the app must take, so a 400 means the document
    # allows what the app refuses (an empty task, a priority past 64 bits...). 503 is a full or draining
    # queue, 413 a body too big to read; schemathesis counts neither as a refusal of the data.
    if steered and response.status_code not in {413, 503}:
        checks.append(positive_data_acceptance)
    case.validate_response(response, checks=checks)


# ------------------------------------------------- the document's edges

JOB_REQUEST = jsonschema_rs.validator_for(openapi_spec()["components"]["schemas"]["JobRequest"])
EDGES: list[tuple[str, Any]] = [
    ("task", ""),
    ("task", "echo\x00"),
    ("task", "x" * (MAX_NAME_BYTES + 1)),
    ("key", ""),
    ("key", "k" * MAX_NAME_BYTES),
    ("key", "k" * (MAX_NAME_BYTES + 1)),
    ("key", "a\x00b"),
    ("key", None),
    ("priority", INT_MIN),
    ("priority", INT_MIN - 1),
    ("priority", INT64_MAX),
    ("priority", INT64_MAX + 1),
    ("priority", INT_MAX),
    ("priority", 3.0),
    ("priority", 1.5),
    ("priority", True),
    ("max_attempts", 0),
    ("max_attempts", 1),
    ("max_attempts", INT64_MAX),
    ("max_attempts", INT64_MAX + 1),
    ("max_attempts", INT_MAX),
    ("delay", 0),
    ("delay", -0.0),
    ("delay", sys.float_info.max),
    ("delay", -1e-300),
    ("delay", 10**400),
    ("delay", "1"),
    ("payload", None),
    ("payload", [1]),
]


async def test_the_document_and_the_app_agree_at_the_edges() -> None:
    # For a real task, a job the document allows is accepted, and one it forbids is refused naming
    # the field, alone and in a batch. (The generated cases rarely reach these values.)
    async with trioq.open_queue(make_registry(), workers=0) as queue:
        app = create_app(queue)
        async with app.test_app() as test_app:
            client = test_app.test_client()
            disagreements = []
            for field, value in EDGES:
                job = {"task": "echo", field: value}
                valid = JOB_REQUEST.is_valid(job)
                for path, body, where in [("/jobs", job, ""), ("/jobs/batch", {"jobs": [job]}, "jobs[0].")]:
                    response = await client.post(path, json=body)
                    answer = await response.get_json()
                    if valid != (response.status_code in (200, 202)) or (
                        not valid and answer.get("field") != where + field
                    ):
                        disagreements.append((path, field, repr(value)[:40], valid, response.status_code, answer))
    assert not disagreements, "\n".join(map(repr, disagreements))


# ------------------------------------------------------ found by probing
# Inputs past what the generators reach, each of which once gave a 500 or the wrong auth answer.


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        pytest.param("/jobs", b'{"task": "echo", "delay": 1' + b"0" * 400 + b"}", id="huge-int-delay"),
        pytest.param("/jobs/batch", b'{"jobs": [{"task": "echo", "delay": 1' + b"0" * 400 + b"}]}", id="batch-delay"),
        pytest.param("/jobs", b"[" * 5000 + b"]" * 5000, id="deeply-nested-json"),
    ],
)
async def test_inputs_that_once_gave_500_are_400(path: str, raw: bytes) -> None:
    async with serving("open") as (client, _):
        headers = {"Authorization": AUTH, "Content-Type": "application/json"}
        response = await client.post(path, data=raw, headers=headers)
        status = response.status_code
    assert status == 400, status


async def test_open_routes_stay_open_under_a_prefix() -> None:
    async with trioq.open_queue(make_registry(), workers=1, shutdown_grace=0) as queue:
        app = QuartTrio("host")
        app.register_blueprint(blueprint(queue, token=TOKEN), url_prefix="/queue")
        async with app.test_app() as test_app:
            client = test_app.test_client()
            statuses = [(await client.get(f"/queue{path}")).status_code for path in sorted(OPEN_ROUTES)]
    assert statuses == [200, 200, 200], statuses
