"""The OpenAPI 3.1 document of :mod:`trioq.http`, served at ``GET /openapi.json``.

The document is plain data built once (:func:`openapi_spec` caches it). It
describes the routes at the root, as :func:`trioq.http.create_app` serves them;
a :func:`trioq.http.blueprint` mounted under a prefix serves the same paths
below that prefix.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any, Final

import attrs

from .._model import INT64_MAX, INT_MIN, MAX_LABEL_BYTES, MAX_NAME_BYTES, MAX_PARENTS, JobState
from .._runtime.listing import MAX_BULK, MAX_PAGE
from .._runtime.totals import Totals

__all__ = ["openapi_spec"]

JSON: Final = "application/json"
TEXT: Final = "text/plain"
_STATES: Final = [state.value for state in JobState]
#: The ``totals`` counters, as ``Queue.stats()`` reports them (one source: the Totals class).
_TOTALS: Final = tuple(field.name for field in attrs.fields(Totals))
_WORKERS: Final = (
    "configured",
    "busy",
    "idle",
    "healthy",
    "unhealthy",
    "replaced",
    "abandoned_threads",
    "abandoned_threads_total",
)


#: What the stores hold as a task name or key (trioq._model.name_problem): not empty, at most
#: MAX_NAME_BYTES of UTF-8, no NUL. The byte limit is a character limit here (JSON Schema counts
#: characters), exact for ASCII; lone surrogates have no portable pattern (ECMA-262 regexes see
#: UTF-16 code units) and are left to the 400.
_NAME: Final = {"minLength": 1, "maxLength": MAX_NAME_BYTES, "pattern": r"^[^\u0000]*$"}
_LABEL: Final = {"minLength": 1, "maxLength": MAX_LABEL_BYTES, "pattern": r"^[^\u0000]*$"}


def _schema(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _response(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/responses/{name}"}


def _json_body(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}, **extra}


def _counts(names: tuple[str, ...] | list[str], description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": {name: {"type": "integer", "minimum": 0} for name in names},
        "required": list(names),
        "additionalProperties": {"type": "integer", "minimum": 0},
    }


def _schemas() -> dict[str, Any]:
    job_request = {
        "type": "object",
        "description": "One job to enqueue. Task-specific payload checks happen at enqueue time (400).",
        "required": ["task"],
        "additionalProperties": False,
        "properties": {
            "task": {
                "type": "string",
                **_NAME,
                "description": "A task name in the queue's registry (else 400).",
            },
            "payload": {
                "type": ["object", "null"],
                "description": (
                    "Keyword arguments of the task's handler; absent or null means {}. Checked at enqueue time"
                    " against the handler (400): JSON that the stores hold (64-bit integers, no lone surrogates)."
                ),
            },
            "delay": {
                "type": "number",
                "minimum": 0,
                "maximum": sys.float_info.max,
                "default": 0,
                "description": "Seconds to wait before the job may run (a finite number >= 0).",
            },
            "priority": {
                "type": ["integer", "null"],
                "minimum": INT_MIN,
                "maximum": INT64_MAX,
                "description": "Higher runs first; absent or null means the task's priority (a signed 64-bit integer).",
            },
            "key": {
                "type": ["string", "null"],
                **_NAME,
                "description": (
                    "Idempotency key: a retained job with this key is returned instead of a new one. At most"
                    f" {MAX_NAME_BYTES} bytes of UTF-8 (a character outside ASCII takes 2 to 4: the"
                    f" {MAX_NAME_BYTES}-character bound here is necessary, not sufficient), without NUL or lone"
                    " surrogates (else 400)."
                ),
            },
            "max_attempts": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": INT64_MAX,
                "description": "Attempts before the job is dead; absent or null means the task's.",
            },
            "queue": {
                "type": ["string", "null"],
                **_LABEL,
                "description": (
                    'The named queue the job waits in; absent or null means the task\'s (else "default"). At most'
                    f" {MAX_LABEL_BYTES} bytes of UTF-8, without NUL or lone surrogates (else 400)."
                ),
            },
            "tenant": {
                "type": ["string", "null"],
                **_LABEL,
                "description": f"Whom the job runs for (at most {MAX_LABEL_BYTES} bytes of UTF-8); null: nobody named.",
            },
            "deadline": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "maximum": sys.float_info.max,
                "description": (
                    "Seconds from now by which the job must have started; a job still waiting then is cancelled,"
                    " its error saying so. Absent or null: no deadline."
                ),
            },
            "limits": {
                "type": ["array", "null"],
                "items": {"type": "string", **_LABEL},
                "description": (
                    "Limit keys the job holds besides its task's; each must match a limit the registry declares"
                    " (else 400)."
                ),
            },
            "after": {
                "type": ["array", "null"],
                "maxItems": MAX_PARENTS,
                "items": {"anyOf": [{"type": "string", **_NAME}, {"type": "integer", "minimum": 0}]},
                "description": (
                    "Ids of parent jobs: the job waits (state waiting) until they all succeed, and is cancelled"
                    " if one ends dead or cancelled. In POST /jobs/batch an integer names an earlier job of the"
                    " same batch (its index). An id the queue does not know, or an integer outside a batch, is"
                    f" a 400. At most {MAX_PARENTS}."
                ),
            },
        },
    }
    job: dict[str, Any] = {
        "type": "object",
        "description": "A snapshot of one job. Times are wall-clock seconds since the epoch.",
        "required": [
            "id",
            "task",
            "payload",
            "state",
            "attempts",
            "epoch",
            "priority",
            "key",
            "max_attempts",
            "run_at",
            "created_at",
            "finished_at",
            "result",
            "error",
            "errors",
            "queue",
            "tenant",
            "deadline",
            "limits",
            "after",
        ],
        "additionalProperties": False,
        "properties": {
            "after": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Ids of the parent jobs it waits for (waiting until they all succeed).",
            },
            "id": {"type": "string"},
            "task": {"type": "string"},
            "payload": {"type": "object"},
            "state": _schema("JobState"),
            "attempts": {"type": "integer", "minimum": 0},
            "epoch": {"type": "integer", "minimum": 0},
            "priority": {"type": "integer", "minimum": INT_MIN, "maximum": INT64_MAX},
            "key": {"type": ["string", "null"]},
            "max_attempts": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
            "run_at": {"type": "number"},
            "created_at": {"type": "number"},
            "finished_at": {"type": ["number", "null"]},
            "result": {"description": "The handler's return value once succeeded (any JSON value)."},
            "error": {"type": ["string", "null"], "description": 'The last error, as "Type: message".'},
            "explain": {
                "type": "array",
                "description": (
                    "GET /jobs/{job_id} only: why the job is not running now (queue.explain's reasons, most"
                    " decisive first)."
                ),
                "items": {
                    "type": "object",
                    "required": ["kind", "message"],
                    "properties": {
                        "kind": {
                            "enum": [
                                "running",
                                "finished",
                                "waiting",
                                "deferred",
                                "scheduled",
                                "paused",
                                "limit",
                                "rate",
                                "no_workers",
                                "busy",
                                "claimable",
                                "deadline",
                            ]
                        },
                        "message": {"type": "string"},
                    },
                },
            },
            "errors": {
                "type": "array",
                "description": "The last failed attempts, oldest first (at most 10), kept across retries.",
                "items": {
                    "type": "object",
                    "required": ["attempt", "error", "traceback", "finished_at"],
                    "additionalProperties": False,
                    "properties": {
                        "attempt": {"type": "integer", "minimum": 1},
                        "error": {"type": "string"},
                        "traceback": {"type": ["string", "null"]},
                        "finished_at": {"type": "number"},
                    },
                },
            },
            "queue": {"type": "string", "description": "The named queue the job waits in."},
            "tenant": {"type": ["string", "null"]},
            "deadline": {
                "type": ["number", "null"],
                "description": "Wall-clock time by which the job must start, else it is cancelled; null: none.",
            },
            "limits": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The limit keys its attempts hold (its task's, filled in, and its enqueue's).",
            },
        },
    }
    accepted = {
        **job,
        "description": (
            "The job as enqueued: ready or scheduled; waiting for parents (after), or cancelled at once if one"
            " ended dead or cancelled; deferred past max_ready; running when the enqueue claimed it for the"
            " serving node's idle workers (PostgreSQL); in any state when its key found a job that holds it"
            " (that job)."
        ),
        "required": [*job["required"], "duplicate"],
        "properties": {
            **job["properties"],
            "duplicate": {
                "type": "boolean",
                "description": "True when its idempotency key found a job that holds it: that job, nothing added.",
            },
        },
    }
    return {
        "JobState": {"type": "string", "enum": list(_STATES)},
        "JobRequest": job_request,
        "BatchRequest": {
            "type": "object",
            "description": "Jobs to enqueue all or nothing. Other top-level keys are ignored.",
            "required": ["jobs"],
            "properties": {"jobs": {"type": "array", "minItems": 1, "items": _schema("JobRequest")}},
        },
        "Accepted": accepted,
        "BatchAccepted": {
            "type": "object",
            "required": ["jobs"],
            "additionalProperties": False,
            "properties": {"jobs": {"type": "array", "minItems": 1, "items": _schema("Accepted")}},
        },
        "Job": job,
        "JobPage": {
            "type": "object",
            "required": ["jobs", "next"],
            "additionalProperties": False,
            "properties": {
                "jobs": {"type": "array", "items": _schema("Job"), "description": "Newest enqueued first."},
                "next": {
                    "type": ["string", "null"],
                    "description": (
                        "The last job's id while the page is full: pass it as `after` for the next page (which may"
                        " be empty); null once a page comes back short."
                    ),
                },
            },
        },
        "BulkRequest": {
            "type": "object",
            "description": (
                "Which jobs a bulk action takes (each field narrows it; none: every job the action can take), at"
                " most `limit` of them, the newest first. An empty body is `{}`."
            ),
            "additionalProperties": False,
            "properties": {
                "state": _schema("JobState"),
                "task": {"type": "string", **_NAME},
                "queue": {"type": "string", **_LABEL},
                "tenant": {"type": "string", **_LABEL},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_BULK, "default": 1000},
            },
        },
        "Count": {
            "type": "object",
            "required": ["count"],
            "additionalProperties": False,
            "properties": {"count": {"type": "integer", "minimum": 0, "description": "The jobs it changed."}},
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": False,
            "properties": {
                "error": {"type": "string", "description": "What went wrong, for people."},
                "field": {
                    "type": "string",
                    "description": 'The offending field, e.g. "delay" or "jobs[1].task".',
                },
                "type": {
                    "enum": ["InvalidJob", "UnknownTask", "JobNotFound", "QueueFull", "TrioqError"],
                    "description": "The trioq error behind the answer, where there is one (trioq.client raises it).",
                },
                "retry_after": {
                    "type": "number",
                    "minimum": 0,
                    "description": "QueueFull only: seconds to wait before enqueueing again (unrounded).",
                },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "additionalProperties": False,
            "properties": {"status": {"const": "ok"}},
        },
        "Readiness": {
            "type": "object",
            "required": ["ready", "reason"],
            "additionalProperties": False,
            "properties": {"ready": {"type": "boolean"}, "reason": {"type": "string"}},
        },
        "QueueSwitch": {
            "type": "object",
            "required": ["queue", "paused", "changed"],
            "additionalProperties": False,
            "properties": {
                "queue": {"type": "string"},
                "paused": {"type": "boolean", "description": "Whether the queue is paused now."},
                "changed": {"type": "boolean", "description": "False when it was in that state already."},
            },
        },
        "Stats": {
            "type": "object",
            "required": ["jobs", "totals", "workers", "queues", "limits"],
            "additionalProperties": False,
            "properties": {
                "jobs": _counts(_STATES, "Jobs in each state now."),
                "cron": {
                    "type": "array",
                    "description": "Each cron schedule: its name, schedule, task, time zone, next run and last tick.",
                    "items": {"type": "object"},
                },
                "totals": _counts(_TOTALS, "Counters since the queue opened."),
                "workers": _counts(_WORKERS, "This node's workers, across its pools."),
                "limits": {
                    "type": "object",
                    "description": (
                        "Each limit key declared by name or in use (held, blocking a job, or with a rate still"
                        " recovering): attempts holding it on every node, its cap now, its rate, the starts its"
                        " rate allows at once now, and the ready jobs waiting for a free slot of it."
                    ),
                    "additionalProperties": {
                        "type": "object",
                        "required": ["in_use", "cap", "rate", "per", "tokens", "blocked"],
                        "additionalProperties": False,
                        "properties": {
                            "in_use": {"type": "integer", "minimum": 0},
                            "cap": {"type": ["integer", "null"], "minimum": 1},
                            "rate": {"type": ["number", "null"]},
                            "per": {"type": "number"},
                            "tokens": {"type": ["integer", "null"], "minimum": 0},
                            "blocked": {"type": "integer", "minimum": 0},
                        },
                    },
                },
                "queues": {
                    "type": "object",
                    "description": (
                        "Each named queue this node has a pool for, or that is paused: whether it is paused, and"
                        ' this node\'s workers for it ("*": the pool that serves every queue).'
                    ),
                    "additionalProperties": {
                        "type": "object",
                        "required": ["paused", "workers"],
                        "additionalProperties": False,
                        "properties": {
                            "paused": {"type": "boolean"},
                            "workers": {"type": "integer", "minimum": 0},
                        },
                    },
                },
            },
        },
    }


def _responses() -> dict[str, Any]:
    retry_after = {
        "description": "Whole seconds to wait before trying again.",
        "required": True,
        "schema": {"type": "string", "pattern": "^[1-9][0-9]*$"},
    }
    return {
        "BadRequest": _json_body(
            "Malformed JSON, a missing, unknown or ill-typed field, or an unknown task; `field` names it.",
            _schema("Error"),
        ),
        "Unauthorized": _json_body(
            "A token is set and the request lacks `Authorization: Bearer <token>` with it.",
            _schema("Error"),
            headers={
                "WWW-Authenticate": {"required": True, "schema": {"const": "Bearer"}},
                "Connection": {"required": True, "schema": {"const": "close"}},
            },
        ),
        "KeyHeld": _json_body(
            "The idempotency key is held by a job of another task (`field` names the key); nothing was added.",
            _schema("Error"),
        ),
        "NotFound": _json_body("No job with that id (never was, or evicted after retention).", _schema("Error")),
        "PayloadTooLarge": _json_body(
            "The request body is over `max_body` bytes; the connection is closed.",
            _schema("Error"),
            headers={"Connection": {"required": True, "schema": {"const": "close"}}},
        ),
        "RequestTimeout": _json_body(
            "The request body did not arrive within the server's body timeout; the connection is closed.",
            _schema("Error"),
            headers={"Connection": {"required": True, "schema": {"const": "close"}}},
        ),
        "BatchIsNoJob": _json_body(
            "The job_id is `batch`: /jobs/batch is the batch route, which takes POST only (`Allow: POST`).",
            _schema("Error"),
            headers={"Allow": {"required": True, "schema": {"const": "POST"}}},
        ),
        "InternalError": _json_body(
            "A bug: logged with its traceback by the server (logger trioq.http); `error` holds a reference to it.",
            _schema("Error"),
        ),
        "Unavailable": _json_body(
            "The queue is full (`max_ready` jobs waiting) or shutting down; nothing was added.",
            _schema("Error"),
            headers={"Retry-After": retry_after},
        ),
    }


def _operation(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    tag: str,
    open_route: bool = False,
    request: str | None = None,
    job_id: bool = False,
) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": operation_id, "summary": summary, "tags": [tag]}
    if open_route:
        operation["security"] = []
    if job_id:
        operation["parameters"] = [
            {
                "name": "job_id",
                "in": "path",
                "required": True,
                "description": "The job's id, as returned when it was enqueued.",
                # /jobs/batch is the batch route, so "batch" is no job id (a 405 for GET and DELETE).
                "schema": {
                    "type": "string",
                    "minLength": 1,
                    "pattern": "^[^/]+$",
                    "not": {"enum": ["batch", "retry", "cancel"]},
                },
            }
        ]
    codes = dict(responses)
    if request is not None:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": _schema(request)}}}
        codes["408"] = _response("RequestTimeout")
    if not open_route:
        codes["401"] = _response("Unauthorized")
    # The size guard runs before routing to any handler, so even a GET with a large body gets 413.
    codes["413"] = _response("PayloadTooLarge")
    codes["500"] = _response("InternalError")
    operation["responses"] = dict(sorted(codes.items()))
    return operation


def _paths() -> dict[str, Any]:
    job = _json_body("The job.", _schema("Job"))
    return {
        "/healthz": {
            "get": _operation(
                "healthz",
                "Liveness: 200 while the process runs.",
                {"200": _json_body("Alive.", _schema("Health"))},
                tag="health",
                open_route=True,
            )
        },
        "/readyz": {
            "get": _operation(
                "readyz",
                "Readiness: whether the queue can run work (open, with a healthy worker).",
                {
                    "200": _json_body("Ready.", _schema("Readiness")),
                    "503": _json_body("Not ready (shutting down, or no healthy worker).", _schema("Readiness")),
                },
                tag="health",
                open_route=True,
            )
        },
        "/openapi.json": {
            "get": _operation(
                "openapi",
                "This document.",
                {"200": _json_body("The OpenAPI 3.1 document.", {"type": "object"})},
                tag="meta",
                open_route=True,
            )
        },
        "/stats": {
            "get": _operation(
                "stats",
                "Job counts per state, totals since the queue opened, and the worker pool.",
                {"200": _json_body("The queue's statistics.", _schema("Stats"))},
                tag="queue",
            )
        },
        "/metrics": {
            "get": _operation(
                "metrics",
                "The statistics in Prometheus text format (metrics prefixed trioq_).",
                {
                    "200": {
                        "description": "Prometheus exposition format 0.0.4.",
                        "content": {TEXT: {"schema": {"type": "string"}}},
                    }
                },
                tag="queue",
            )
        },
        "/jobs": {
            "get": _listing(),
            "post": _operation(
                "enqueueJob",
                "Enqueue one job.",
                {
                    "202": _json_body("Accepted.", _schema("Accepted")),
                    "200": _json_body(
                        "Its key found the job that holds it: that job (`duplicate` true), nothing added.",
                        _schema("Accepted"),
                    ),
                    "400": _response("BadRequest"),
                    "409": _response("KeyHeld"),
                    "503": _response("Unavailable"),
                },
                tag="jobs",
                request="JobRequest",
            ),
        },
        "/jobs/batch": {
            "post": _operation(
                "enqueueBatch",
                "Enqueue several jobs, all or nothing.",
                {
                    "202": _json_body("All accepted, in order (each with `duplicate`).", _schema("BatchAccepted")),
                    "200": _json_body(
                        "Every job's key found a job that holds it: those jobs, nothing added.",
                        _schema("BatchAccepted"),
                    ),
                    "400": _response("BadRequest"),
                    "409": _response("KeyHeld"),
                    "503": _response("Unavailable"),
                },
                tag="jobs",
                request="BatchRequest",
            )
        },
        "/jobs/retry": {"post": _bulk("retryJobs", "Retry the dead or cancelled jobs the filters take (retry_many).")},
        "/jobs/cancel": {"post": _bulk("cancelJobs", "Cancel the unfinished jobs the filters take (cancel_many).")},
        "/jobs/{job_id}": {
            "get": _operation(
                "getJob",
                "The job's current snapshot.",
                {"200": job, "404": _response("NotFound"), "405": _response("BatchIsNoJob")},
                tag="jobs",
                job_id=True,
            ),
            "delete": _operation(
                "cancelJob",
                "Cancel the job unless it finished (a running attempt is stopped); a finished job is returned as is.",
                {"200": job, "404": _response("NotFound"), "405": _response("BatchIsNoJob")},
                tag="jobs",
                job_id=True,
            ),
        },
        "/jobs/{job_id}/retry": {
            "post": _operation(
                "retryJob",
                "Run a dead or cancelled job again from scratch (attempts reset to 0).",
                {
                    "200": job,
                    "404": _response("NotFound"),
                    "409": _json_body('The job is neither dead nor cancelled (`field` is "state").', _schema("Error")),
                    "503": _response("Unavailable"),
                },
                tag="jobs",
                job_id=True,
            )
        },
        "/queues/{name}/pause": {
            "post": _switch(
                "pauseQueue", "Stop every node claiming jobs of the named queue (persisted; running attempts finish)."
            )
        },
        "/queues/{name}/resume": {
            "post": _switch("resumeQueue", "Let every node claim jobs of the named queue again.")
        },
    }


def _listing() -> dict[str, Any]:
    """GET /jobs: a page of jobs, newest first, by state, task, queue and tenant."""
    operation = _operation(
        "listJobs",
        "A page of jobs, newest enqueued first, filtered by state, task, queue and tenant.",
        {
            "200": _json_body("The page.", _schema("JobPage")),
            "400": _json_body(
                "A bad filter, limit, or an `after` the queue no longer holds (`field` names it).", _schema("Error")
            ),
        },
        tag="jobs",
    )

    def parameter(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}

    operation["parameters"] = [
        parameter("state", "Only jobs in this state.", _schema("JobState")),
        parameter("task", "Only jobs of this task.", {"type": "string", **_NAME}),
        parameter("queue", "Only jobs of this named queue.", {"type": "string", **_LABEL}),
        parameter("tenant", "Only jobs of this tenant.", {"type": "string", **_LABEL}),
        parameter("limit", "Jobs per page.", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100}),
        parameter("after", "The `next` of the page before: list the jobs enqueued before it.", {"type": "string"}),
    ]
    return operation


def _bulk(operation_id: str, summary: str) -> dict[str, Any]:
    """POST /jobs/retry or /jobs/cancel: a bulk action over the jobs a filter takes."""
    operation = _operation(
        operation_id,
        summary,
        {
            "200": _json_body("Done: how many jobs it changed.", _schema("Count")),
            "400": _json_body("A bad filter or limit (`field` names it).", _schema("Error")),
            "503": _response("Unavailable"),
        },
        tag="jobs",
        request="BulkRequest",
    )
    operation["requestBody"]["required"] = False
    return operation


def _switch(operation_id: str, summary: str) -> dict[str, Any]:
    """A pause or resume route of a named queue."""
    operation = _operation(
        operation_id,
        summary,
        {
            "200": _json_body(
                "Done; `changed` says whether the queue was in the other state before.", _schema("QueueSwitch")
            ),
            "400": _json_body('The name cannot name a queue (`field` is "queue").', _schema("Error")),
            "503": _response("Unavailable"),
        },
        tag="queue",
    )
    operation["parameters"] = [
        {
            "name": "name",
            "in": "path",
            "required": True,
            "description": "The named queue (one path segment; a name holding / is paused from Python only).",
            "schema": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
        }
    ]
    return operation


@cache
def openapi_spec() -> dict[str, Any]:
    """The OpenAPI 3.1 document describing every route of :func:`trioq.http.blueprint`.

    Built on the first call and cached: every call returns the same dict, so
    treat it as read-only (copy it before changing it).
    """
    from .. import __version__  # here, not at import time: trioq.http may be imported while trioq loads

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "trioq",
            "version": __version__,
            "summary": "The HTTP face of a trioq job queue.",
            "description": (
                'Errors are `{"error": ..., "field"?: ...}`. With a token set, every route but /healthz, '
                "/readyz and /openapi.json needs `Authorization: Bearer <token>`."
            ),
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "tags": [
            {"name": "health", "description": "Probes for orchestrators; never need a token."},
            {"name": "meta", "description": "About this API."},
            {"name": "queue", "description": "The queue as a whole."},
            {"name": "jobs", "description": "Enqueue, inspect, cancel and retry jobs."},
        ],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "responses": _responses(),
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The token of create_app or blueprint (`trioq serve --token`, or TRIOQ_TOKEN).",
                }
            },
        },
    }
