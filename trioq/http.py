"""The HTTP face of a queue: a Quart-Trio app, or a blueprint for your own app.

Install with ``pip install "trioq[http]"``. Routes (JSON unless noted)::

    GET    /healthz            200 while the process runs
    GET    /readyz             200 when the queue can run work, else 503 with the reason
    GET    /stats              queue.stats()
    GET    /metrics            Prometheus text: gauges and counters prefixed trioq_, and
                               histograms of queue wait and run time per task
    GET    /openapi.json       this API as an OpenAPI 3.1 document
    POST   /jobs               {"task", "payload"?, "delay"?, "priority"?, "key"?, "max_attempts"?} -> 202
    POST   /jobs/batch         {"jobs": [...]} -> 202, all or nothing
    GET    /jobs/<id>          the job
    DELETE /jobs/<id>          cancel it
    POST   /jobs/<id>/retry    run a dead or cancelled job again

Errors are ``{"error": ..., "field"?: ...}``: 400 for malformed JSON, a missing or
ill-typed field or an unknown task; 401 without the right bearer token (every
route but /healthz and /readyz, when a token is set; compared in constant
time); 404 for an unknown job; 409 for a retry of a job that is not dead or
cancelled; 413 for a body over ``max_body`` bytes; 503 with ``Retry-After`` when
the queue is full (``max_ready``) or shutting down. Nothing is half-accepted.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from quart import Blueprint, Response, request
from quart_trio import QuartTrio

from ._model import InvalidJob, JobNotFound, JobSpec, QueueFull, TrioqError, UnknownTask
from ._openapi import openapi_spec
from ._runtime import Queue

__all__ = ["blueprint", "create_app"]

DEFAULT_MAX_BODY = 1024 * 1024
_JOB_FIELDS = frozenset({"task", "payload", "delay", "priority", "key", "max_attempts"})
# By endpoint name, so the routes stay open under a blueprint's url_prefix.
_OPEN_ENDPOINTS = frozenset({"healthz", "readyz", "openapi"})


class _HTTPError(Exception):
    def __init__(self, status: int, error: str, *, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(error)
        self.status, self.error, self.field, self.headers = status, error, field, headers or {}

    def response(self) -> Response:
        body: dict[str, Any] = {"error": self.error}
        if self.field is not None:
            body["field"] = self.field
        return _json(body, self.status, self.headers)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, headers=headers or {}, content_type="application/json")


def _spec(data: Any, where: str) -> JobSpec:
    """A JobSpec from one JSON job object; types are checked by the queue itself."""
    if not isinstance(data, dict):
        raise _HTTPError(400, f"{where or 'body'} must be a JSON object", field=where.rstrip(".") or None)
    unknown = sorted(data.keys() - _JOB_FIELDS)
    if unknown:
        raise _HTTPError(400, f"unknown field {unknown[0]!r}", field=f"{where}{unknown[0]}")
    if "task" not in data:
        raise _HTTPError(400, "task is required", field=f"{where}task")
    if not isinstance(data["task"], str):
        raise _HTTPError(400, "task must be a string", field=f"{where}task")
    payload = data.get("payload", {})
    if payload is None:
        payload = {}
    return JobSpec(
        data["task"],
        payload,
        data.get("delay", 0.0),
        _whole(data.get("priority")),
        data.get("key"),
        _whole(data.get("max_attempts")),
    )


def _whole(value: Any) -> Any:
    """JSON's 3.0 is an integer to JSON Schema, so it is one here too."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


async def _body(max_body: int) -> Any:
    raw = await request.get_data()
    if len(raw) > max_body:  # no Content-Length, or a host app with a larger limit
        raise _HTTPError(413, f"request body over {max_body} bytes")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _HTTPError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise _HTTPError(400, "malformed JSON: nested too deeply") from None


def _translate(exc: TrioqError) -> _HTTPError:
    if isinstance(exc, QueueFull):
        return _HTTPError(503, str(exc), headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
    if isinstance(exc, UnknownTask):
        return _HTTPError(400, str(exc), field="task")
    if isinstance(exc, InvalidJob):
        return _HTTPError(400, str(exc), field=exc.field)
    if isinstance(exc, JobNotFound):
        return _HTTPError(404, str(exc))
    return _HTTPError(503, str(exc), headers={"Retry-After": "5"})  # shutting down


class _Metrics:
    """A Prometheus collector that reads ``queue.stats()`` when scraped."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.stats: dict[str, Any] = {}

    def collect(self) -> Any:
        stats = self.stats
        jobs = GaugeMetricFamily("trioq_jobs", "Jobs in each state", labels=["state"])
        for state, n in stats.get("jobs", {}).items():
            jobs.add_metric([state], n)
        yield jobs
        for name, value in stats.get("totals", {}).items():
            yield CounterMetricFamily(f"trioq_{name}", f"Total {name.replace('_', ' ')} since the queue opened", value)
        for name, value in stats.get("workers", {}).items():
            yield GaugeMetricFamily(f"trioq_workers_{name}", f"Workers: {name.replace('_', ' ')}", value)


def blueprint(queue: Queue, *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY) -> Blueprint:
    """The routes above, for mounting into your own Quart-Trio app.

    ``max_body`` is enforced here too, so a host app need not set
    ``MAX_CONTENT_LENGTH`` (an over-long body gets 413 before it is read).
    """
    bp = Blueprint("trioq", __name__)
    metrics = _Metrics(queue)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    buckets = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300)
    waits = Histogram(
        "trioq_queue_wait_seconds", "From run_at to attempt start", ["task"], registry=registry, buckets=buckets
    )
    runs = Histogram("trioq_run_seconds", "Attempt run time", ["task"], registry=registry, buckets=buckets)

    def observe(task: str, wait: float, run: float) -> None:
        waits.labels(task).observe(wait)
        runs.labels(task).observe(run)

    queue.observe_attempts(observe)
    expected = None if token is None else token.encode()

    @bp.before_request
    async def _guard() -> Response | None:
        # Answering before the body is read can leave a kept-alive connection
        # hanging under hypercorn + quart-trio (seen with 401 and 413), so
        # these early answers close the connection, and a small body is
        # drained before a 401.
        length = request.content_length
        if length is not None and length > max_body:
            headers = {"Connection": "close"}
            return _HTTPError(413, f"request body over {max_body} bytes", headers=headers).response()
        if expected is None or (request.endpoint or "").rpartition(".")[2] in _OPEN_ENDPOINTS:
            return None
        given = request.headers.get("Authorization", "")
        scheme, _, credential = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(), expected):
            if length is not None:
                await request.get_data()
            headers = {"WWW-Authenticate": "Bearer", "Connection": "close"}
            return _HTTPError(401, "missing or wrong bearer token", headers=headers).response()
        return None

    def handled(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        async def route(**kwargs: Any) -> Response:
            try:
                return await fn(**kwargs)
            except _HTTPError as exc:
                return exc.response()
            except TrioqError as exc:
                return _translate(exc).response()

        route.__name__ = fn.__name__
        return route

    @bp.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @bp.get("/readyz")
    async def readyz() -> Response:
        ready, reason = queue.readiness()
        return _json({"ready": ready, "reason": reason}, 200 if ready else 503)

    @bp.get("/openapi.json")
    async def openapi() -> Response:
        return _json(openapi_spec())

    @bp.get("/stats")
    @handled
    async def stats() -> Response:
        return _json(await queue.stats())

    @bp.get("/metrics")
    @handled
    async def metrics_route() -> Response:
        metrics.stats = await queue.stats()
        return Response(generate_latest(registry), content_type="text/plain; version=0.0.4; charset=utf-8")

    @bp.post("/jobs")
    @handled
    async def submit() -> Response:
        job = await queue.enqueue_many([_spec(await _body(max_body), "")])
        return _json({"id": job[0].id, "state": job[0].state.value}, 202)

    @bp.post("/jobs/batch")
    @handled
    async def submit_batch() -> Response:
        body = await _body(max_body)
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
            raise _HTTPError(400, 'body must be {"jobs": [...]}', field="jobs")
        if not body["jobs"]:
            raise _HTTPError(400, "jobs must not be empty", field="jobs")
        specs = [_spec(item, f"jobs[{index}].") for index, item in enumerate(body["jobs"])]
        try:
            jobs = await queue.enqueue_many(specs)
        except UnknownTask as exc:
            missing = next(i for i, s in enumerate(specs) if s.task not in queue.registry)
            raise _HTTPError(400, str(exc), field=f"jobs[{missing}].task") from None
        return _json({"jobs": [{"id": j.id, "state": j.state.value} for j in jobs]}, 202)

    @bp.get("/jobs/<job_id>")
    @handled
    async def get_job(job_id: str) -> Response:
        return _json((await queue.get(job_id)).to_dict())

    @bp.delete("/jobs/<job_id>")
    @handled
    async def cancel_job(job_id: str) -> Response:
        return _json((await queue.cancel(job_id)).to_dict())

    @bp.post("/jobs/<job_id>/retry")
    @handled
    async def retry_job(job_id: str) -> Response:
        try:
            return _json((await queue.retry(job_id)).to_dict())
        except InvalidJob as exc:
            raise _HTTPError(409, str(exc), field=exc.field) from None

    return bp


def create_app(queue: Queue, *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY) -> QuartTrio:
    """A Quart-Trio app serving :func:`blueprint` at the root."""
    app = QuartTrio("trioq")
    app.config["MAX_CONTENT_LENGTH"] = max_body
    app.register_blueprint(blueprint(queue, token=token, max_body=max_body))

    @app.errorhandler(413)
    async def too_large(error: Exception) -> Response:
        return _HTTPError(413, f"request body over {max_body} bytes").response()

    @app.errorhandler(404)
    async def not_found(error: Exception) -> Response:
        return _HTTPError(404, f"no route {request.method} {request.path}").response()

    @app.errorhandler(405)
    async def not_allowed(error: Exception) -> Response:
        return _HTTPError(405, f"{request.method} is not allowed on {request.path}").response()

    return app
