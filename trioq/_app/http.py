"""The HTTP face of a queue: a Quart-Trio app, or a blueprint for your own app.

Install with ``pip install "trioq[http]"``. Routes (JSON unless noted)::

    GET    /healthz            200 while the process runs
    GET    /readyz             200 when the queue can run work, else 503 with the reason
    GET    /stats              queue.stats()
    GET    /metrics            Prometheus text: gauges and counters prefixed trioq_, and
                               histograms of queue wait and run time per task
    GET    /openapi.json       this API as an OpenAPI 3.1 document
    POST   /jobs               {"task", "payload"?, "delay"?, "priority"?, "key"?, "max_attempts"?,
                                "queue"?, "tenant"?, "deadline"?, "limits"?, "after"?} -> 202, the job
    POST   /jobs/batch         {"jobs": [...]} -> 202 {"jobs": [the jobs]}, all or nothing
    GET    /jobs               ?state=&task=&queue=&tenant=&limit=&after= -> {"jobs": [...], "next"}:
                               a page, newest first; "next" (the last id, for after=) while pages are full
    POST   /jobs/retry         {"state"?, "task"?, "queue"?, "tenant"?, "limit"?} -> {"count"}: retry_many
    POST   /jobs/cancel        the same filters -> {"count"}: cancel_many
    GET    /jobs/<id>          the job, with "explain": why it is not running (queue.explain's reasons)
    DELETE /jobs/<id>          cancel it
    POST   /jobs/<id>/retry    run a dead or cancelled job again
    POST   /queues/<name>/pause   no node claims from that named queue until resumed
                                  -> {"queue", "paused": true, "changed"}
    POST   /queues/<name>/resume  claims from it go on -> {"queue", "paused": false, "changed"}
    GET    /ui ...             the web dashboard (HTML; its own login and cookie: see trioq._app.ui)

A queue name in a path is one segment: a queue whose name holds ``/`` is paused
from Python (``queue.pause``), not over HTTP.

``batch`` is never a job id: ``GET`` or ``DELETE /jobs/batch`` is a 405, not a
lookup of a job called "batch".

Errors are ``{"error": ..., "field"?: ...}``: 400 for malformed JSON, a missing or
ill-typed field or an unknown task; 401 without the right bearer token (every
route but /healthz, /readyz and /openapi.json, when a token is set; compared in
constant time); 404 for an unknown job or route; 405 with ``Allow`` for a method
the path does not serve; 408 for a body that does not arrive within Quart's
``BODY_TIMEOUT``; 409 for a retry of a job that is not dead or cancelled; 413
for a body over ``max_body`` bytes; 503 with ``Retry-After`` when the queue is
full (``max_ready``) or shutting down. Nothing is half-accepted. Any other
exception in a route is a bug: it is logged with its traceback on the
``trioq.http`` logger, and the client gets a 500 whose error names a reference
to find it in the log, never the traceback itself. 401, 408 and 413 close the
connection (``Connection: close``): the body may not have been read to its end.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, ASGISendCallable, ASGISendEvent
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from quart import Blueprint, Response, request
from quart.blueprints import BlueprintSetupState
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException, InternalServerError, MethodNotAllowed, RequestEntityTooLarge
from werkzeug.routing import BaseConverter

from .._model import InvalidJob, JobNotFound, JobSpec, QueueFull, TrioqError, UnknownTask
from .._runtime.queue import Queue
from ..stores._base import Added, KeyClash
from .openapi import openapi_spec
from .ui import is_ui_request, ui_blueprint

__all__ = ["blueprint", "create_app"]

DEFAULT_MAX_BODY = 1024 * 1024
_JOB_FIELDS = frozenset(
    {"task", "payload", "delay", "priority", "key", "max_attempts", "queue", "tenant", "deadline", "limits", "after"}
)
# By endpoint name, so the routes stay open under a blueprint's url_prefix.
_OPEN_ENDPOINTS = frozenset({"healthz", "readyz", "openapi"})
#: Answers given before the request body is read to its end: the connection
#: cannot carry another request, so the client is told it closes.
_CLOSE = {"Connection": "close"}

_logger = logging.getLogger("trioq.http")

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _HTTPError(Exception):
    """An answer in the JSON error shape: ``{"error", "field"?, "type"?, "retry_after"?}``.

    ``type`` names the trioq error a route met (``InvalidJob``, ``UnknownTask``, ``JobNotFound``,
    ``QueueFull``, ``TrioqError``), so that a client raises the same; ``retry_after`` is a
    ``QueueFull``'s own seconds (the ``Retry-After`` header holds them rounded up)."""

    def __init__(
        self,
        status: int,
        error: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(error)
        self.status, self.error, self.field, self.headers = status, error, field, headers or {}
        self.kind, self.retry_after = kind, retry_after

    def response(self) -> Response:
        # Lone surrogates (echoed from a bad input) as backslash escapes: json.dumps
        # would write them as "\udcff", which strict JSON parsers refuse.
        body: dict[str, Any] = {"error": _printable(self.error)}
        if self.field is not None:
            body["field"] = _printable(self.field)
        if self.kind is not None:
            body["type"] = self.kind
        if self.retry_after is not None:
            body["retry_after"] = self.retry_after
        return _json(body, self.status, self.headers)


def _printable(text: str) -> str:
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, headers=headers or {}, content_type="application/json")


# ------------------------------------------------------------------ tokens


def _token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token (a phrase such as ``"is empty"``), or ``None``.

    A token is one or more printable ASCII characters other than space (``!``
    to ``~``). An empty or whitespace-only token is refused rather than taken
    to mean "no authentication": that is ``token=None``, said on purpose, never
    an unset variable. Spaces and control characters cannot cross a header
    intact (its ends are trimmed; a newline ends it).

    Non-ASCII is refused up front rather than matched as UTF-8 bytes: HTTP
    gives header bytes no charset (RFC 9110, section 5.5) and clients
    disagree about them. ``requests`` sends latin-1, so "é" arrives as one
    byte that matches no UTF-8 encoding; ``httpx`` (and so ``trioq loadgen``)
    refuses to send non-ASCII at all; browsers' ``fetch`` refuses anything past
    U+00FF; curl sends whatever bytes the shell had. A non-ASCII token would
    work for some clients and be a baffling 401 for the rest; a clear error
    at startup is better. ``secrets.token_urlsafe()`` makes a good token.
    """
    if token == "":
        return "is empty"
    if not token.strip():
        return "is only whitespace"
    for index, char in enumerate(token):
        if not "!" <= char <= "~":
            return (
                f"holds {char!r} (U+{ord(char):04X}) at index {index}; a bearer token must be printable"
                " ASCII without spaces (clients disagree on how to send anything else in a header)"
            )
    return None


def _expected_token(token: str | None) -> bytes | None:
    """The bytes a request's bearer token must equal, or ``None`` for no authentication."""
    if token is None:
        return None
    if not isinstance(token, str):
        raise TypeError(f"token must be a str or None, got {type(token).__name__}")
    problem = _token_problem(token)
    if problem is not None:
        raise ValueError(
            f"token {problem}: pass token=None to serve without authentication, or a token such as"
            " secrets.token_urlsafe()"
        )
    return token.encode("ascii")


# -------------------------------------------------------------- the request


def _spec(data: Any, where: str) -> JobSpec:
    """A JobSpec from one JSON job object; types are checked by the queue itself."""
    if not isinstance(data, dict):
        raise _HTTPError(400, f"{where.rstrip('.') or 'body'} must be a JSON object", field=where.rstrip(".") or None)
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
        data.get("queue"),
        data.get("tenant"),
        data.get("deadline"),
        () if data.get("limits") is None else data["limits"],
        _parent_ids(data.get("after")),
    )


#: GET /jobs's query parameters; the body fields of POST /jobs/retry and /jobs/cancel.
_LIST_PARAMETERS = frozenset({"state", "task", "queue", "tenant", "limit", "after"})
_BULK_FIELDS = frozenset({"state", "task", "queue", "tenant", "limit"})


def _one(args: Any, name: str) -> str | None:
    """The query parameter ``name`` given at most once (``None``: not given); twice is a 400."""
    values = args.getlist(name)
    if len(values) > 1:
        raise _HTTPError(400, f"{name} is given {len(values)} times; give it once", field=name)
    return values[0] if values else None


def _count(text: str | None, default: int) -> int:
    """A ``limit`` query parameter as an int (its range is the queue's to check)."""
    if text is None:
        return default
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise _HTTPError(400, f"limit must be a whole number, got {text!r:.40}", field="limit")
    return int(text)


def _bulk(body: Any) -> dict[str, Any]:
    """The filters of a bulk action's body (``{}`` or an empty body: every job the action can take)."""
    if not isinstance(body, dict):
        raise _HTTPError(400, "body must be a JSON object of filters (state, task, queue, tenant, limit)")
    unknown = sorted(body.keys() - _BULK_FIELDS)
    if unknown:
        raise _HTTPError(400, f"unknown field {unknown[0]!r}", field=unknown[0])
    return {name: _whole(value) for name, value in body.items()}


def _accepted(jobs: Added, index: int) -> dict[str, Any]:
    """Job ``index`` of an enqueue's answer: the job, and whether its key found it (``duplicate``)."""
    return {**jobs[index].to_dict(), "duplicate": index in jobs.existing}


def _whole(value: Any) -> Any:
    """JSON's 3.0 is an integer to JSON Schema, so it is one here too."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _parent_ids(after: Any) -> Any:
    """``after`` with JSON's whole-number floats as integers (batch indexes); ``None`` is no parents."""
    if after is None:
        return ()
    return [_whole(parent) for parent in after] if isinstance(after, list) else after


def _limit(max_body: int) -> int:
    """The body limit in force: ``max_body``, or the host app's ``MAX_CONTENT_LENGTH`` if lower."""
    host = request.max_content_length
    return max_body if host is None else min(max_body, host)


def _too_large(limit: int) -> _HTTPError:
    return _HTTPError(413, f"request body over {limit} bytes", headers=_CLOSE)


async def _read_body(max_body: int) -> bytes:
    """The request body, read as it arrives and refused (413) once over the limit.

    Read piece by piece rather than with ``request.get_data()``, which waits
    for all of a chunked body however long (up to the host's
    ``MAX_CONTENT_LENGTH``, 16 MiB by default, or without end if it is
    ``None``) before anyone counts it. Raises a 408 if the body takes longer
    than the app's ``BODY_TIMEOUT``, as ``get_data`` would.
    """
    limit = _limit(max_body)
    timeout = request.body_timeout
    parts: list[bytes] = []
    size = 0
    with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
        try:
            async for part in request.body:
                size += len(part)
                if size > limit:
                    raise _too_large(limit)
                parts.append(part)
        except RequestEntityTooLarge:  # Quart's own check of Content-Length against its limit
            raise _too_large(limit) from None
    if scope.cancelled_caught:
        raise _HTTPError(408, f"request body not received within {timeout} seconds", headers=_CLOSE)
    return b"".join(parts)


#: What an unauthenticated request's body may cost before its 401: bytes, seconds.
_DRAIN_BYTES, _DRAIN_SECONDS = 64 * 1024, 1.0


async def _discard_some_body() -> None:
    """Read and drop the request body, up to :data:`_DRAIN_BYTES` or :data:`_DRAIN_SECONDS`."""
    seen = 0
    with trio.move_on_after(_DRAIN_SECONDS), contextlib.suppress(HTTPException):
        async for part in request.body:
            seen += len(part)
            if seen > _DRAIN_BYTES:
                break


async def _body(max_body: int, *, empty: Any = None) -> Any:
    """The request body as JSON; an empty body is ``empty`` if given, else a 400."""
    raw = await _read_body(max_body)
    if empty is not None and not raw.strip():
        return empty
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        if "integer string conversion" in str(exc):  # CPython's digit limit, not a JSON error
            raise _HTTPError(400, "the body holds an integer of over 4300 digits; no store holds one") from None
        raise _HTTPError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise _HTTPError(400, "malformed JSON: nested too deeply") from None


# ---------------------------------------------------------------- errors


def _translate(exc: TrioqError) -> _HTTPError | None:
    """The answer to a trioq error a route may meet, or ``None`` if it is a bug (a 500)."""
    if isinstance(exc, QueueFull):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
        return _HTTPError(503, str(exc), headers=headers, kind="QueueFull", retry_after=exc.retry_after)
    if isinstance(exc, UnknownTask):
        return _HTTPError(400, str(exc), field="task", kind="UnknownTask")
    if isinstance(exc, InvalidJob):
        return _HTTPError(400, str(exc), field=exc.field, kind="InvalidJob")
    if isinstance(exc, JobNotFound):
        return _HTTPError(404, str(exc), kind="JobNotFound")
    if type(exc) is TrioqError:  # what the queue raises once it is shutting down
        return _HTTPError(503, str(exc), headers={"Retry-After": "5"}, kind="TrioqError")
    return None  # WALCorruption, SimulatedCrash, ...: not the client's to retry


def _internal_error(exc: BaseException) -> Response:
    """A JSON 500 for a bug, logged on ``trioq.http`` with its traceback under a reference.

    The client gets the reference, to quote, and nothing of the exception:
    its message may hold paths, payloads or other clients' data.
    """
    reference = secrets.token_hex(4)
    _logger.error(
        "unhandled error answering %s %s (reference %s)",
        request.method,
        request.path,
        reference,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return _HTTPError(500, f"internal server error (reference {reference}); the server log has the details").response()


def _allowed(error: MethodNotAllowed) -> str:
    """The ``Allow`` value of a 405: the methods the path serves (HEAD with GET).

    OPTIONS, which Quart answers on every route by itself, is not advertised.
    """
    return ", ".join(sorted(set(error.valid_methods or ()) - {"OPTIONS"}))


def _http_exception(error: HTTPException, max_body: int) -> Response:
    """Quart's and Werkzeug's HTTP errors (no route, wrong method, too large...) as JSON."""
    if isinstance(error, InternalServerError):
        original = error.original_exception
        return _internal_error(error if original is None else original)
    code = error.code or 500
    headers = {name: value for name, value in error.get_headers() if name.lower() != "content-type"}
    if isinstance(error, MethodNotAllowed):
        headers["Allow"] = _allowed(error)
        return _HTTPError(405, f"{request.method} is not allowed on {request.path}", headers=headers).response()
    if code == 404:
        return _HTTPError(404, f"no route {request.method} {request.path}", headers=headers).response()
    if code == 413:
        return _too_large(_limit(max_body)).response()
    return _HTTPError(code, error.description or error.name, headers=headers).response()


def _answering(max_body: int) -> Callable[[Callable[_P, Awaitable[_R]]], Callable[_P, Awaitable[_R | Response]]]:
    """A decorator making every exception of a route an answer in the JSON error shape.

    It is applied to each route itself, not left to app-level error handlers,
    so the blueprint answers the same inside a host app that has handlers
    of its own (or none).
    """

    def decorate(fn: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R | Response]]:
        @functools.wraps(fn)
        async def route(*args: _P.args, **kwargs: _P.kwargs) -> _R | Response:
            try:
                return await fn(*args, **kwargs)
            except _HTTPError as exc:
                return exc.response()
            except TrioqError as exc:
                answer = _translate(exc)
                return _internal_error(exc) if answer is None else answer.response()
            except HTTPException as exc:
                return _http_exception(exc, max_body)
            except Exception as exc:
                return _internal_error(exc)

        return route

    return decorate


# ---------------------------------------------------------------- routing


class _JobId(BaseConverter):
    """A job id in a path: one segment, never ``batch``, ``retry`` or ``cancel`` (``/jobs/batch``,
    ``/jobs/retry`` and ``/jobs/cancel`` are routes of their own).

    Without it, ``GET /jobs/batch`` would be routed as a lookup of a job
    called "batch" (and answer 404) instead of 405. Ids the stores make are
    hex with a dash, so no job can be called that.
    """

    regex = r"(?!(?:batch|retry|cancel)(?![^/]))[^/]+"
    part_isolating = True  # it never matches a "/" (Werkzeug guesses False from the "/" in the regex)


_JOB_ID_CONVERTER = "trioq_job_id"
#: Werkzeug answers a path with an empty segment (``/jobs//retry``) with a 308 to the path with it
#: merged away (``/jobs/retry``); for ``f"/jobs/{job_id}/retry"`` with an empty id that is a bulk
#: action, and clients that follow a 308 (requests, curl -L) repeat the POST there. No rule of
#: these routes takes such a path: a 404.
_EXACT: dict[str, Any] = {"merge_slashes": False}


class _HTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's ASGI HTTP connection, with the last message of each response sent shielded.

    Why: hypercorn (0.18, h11) finishes a response inside the app's last
    ``send``. ``H11Protocol._maybe_recycle`` first ends the stream, which
    puts ``http.disconnect`` in the app's receive channel; then it either
    re-arms the keep-alive timer or, when the connection cannot carry
    another request (``Connection: close`` from either side, or a request
    body not read to its end, as after an early 401 or 413), closes the
    socket (``TCPServer._close``: ``send_eof``, then ``aclose``). But
    quart-trio's ``handle_messages`` returns on that ``http.disconnect`` and
    cancels the request's nursery, with this task still inside ``send``: the
    cancellation lands on ``send_eof``'s checkpoint, ``aclose`` never runs,
    and the socket stays open until the client gives up (no timer covers it:
    the idle timer is off during a request). On a kept connection it can land
    in the start of the idle timer instead, so an idle connection outlives
    ``keep_alive_timeout``. Shielding that one message lets hypercorn finish.
    It cannot hold the task long: the body went out in earlier messages
    (hypercorn shields its socket writes itself), and quart-trio keeps
    draining the receive channel until the disconnect.

    Two more things it does for every response: one that starts before the
    request's body has arrived to its end (a 404, a 405, an early 401 or
    413) says ``Connection: close``, since hypercorn will not carry another
    request on that connection (without it, a client's next request on the
    connection is lost); and a request with an empty path (``GET ?``), on
    which Quart itself fails, gets a JSON 400.
    """

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if not self.scope.get("path"):
            await _send_json_directly(send, 400, {"error": "the request has no path"})
            return
        body_done = not _has_body(self.scope["headers"])

        async def receive_noting_the_end() -> ASGIReceiveEvent:
            nonlocal body_done
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done = True
            return message

        async def send_last_shielded(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.start" and not body_done:
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"connection" for name, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await super().__call__(receive_noting_the_end, send_last_shielded)


def _has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request with these headers has a body to wait for (HTTP/1.1: a
    ``Transfer-Encoding``, or a ``Content-Length`` other than 0)."""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"transfer-encoding" or (lowered == b"content-length" and value.strip() != b"0"):
            return True
    return False


async def _send_json_directly(send: ASGISendCallable, status: int, body: dict[str, Any]) -> None:
    """A whole JSON response on the ASGI ``send``, for a request Quart cannot take, closing the connection."""
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"connection", b"close")]})
    with trio.CancelScope(shield=True):  # as above: the last message must not be cut off
        await send({"type": "http.response.body", "body": data, "more_body": False})


# ---------------------------------------------------------------- metrics


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


# ------------------------------------------------------------------- faces


def blueprint(queue: Queue, *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY) -> Blueprint:
    """The routes above, for mounting into your own Quart-Trio app.

    ``token=None`` serves without authentication; any other token must be
    printable ASCII without spaces, else ``ValueError`` (an empty or blank
    token is refused, never taken as "no authentication"; see the module
    docs for why non-ASCII is refused). ``max_body`` is enforced here too, so
    a host app need not set ``MAX_CONTENT_LENGTH`` (an over-long body gets
    413 before it is read; a host limit lower than ``max_body`` wins). Every
    error of these routes, a bug's 500 included, is answered in the JSON
    error shape whatever error handlers the host app has; a request no route
    takes (404, 405) is the host app's to answer. Mounting registers a URL
    converter named ``trioq_job_id`` on the host app.

    A QuartTrio host app that still uses quart-trio's own connection class
    gets trioq's (``_HTTPConnection`` in this module's source: quart-trio
    cancels the last ``send`` of a response, so under hypercorn a connection
    that should close stays open); a host app with a class of its own keeps it.
    """
    expected = _expected_token(token)
    bp = Blueprint("trioq", __name__)

    def set_up_host(state: BlueprintSetupState) -> None:
        state.app.url_map.converters.setdefault(_JOB_ID_CONVERTER, _JobId)
        host = state.app
        if isinstance(host, QuartTrio) and host.asgi_http_class is TrioASGIHTTPConnection:  # quart-trio's own
            host.asgi_http_class = _HTTPConnection

    # Before the routes: a rule's converters are looked up when it is added to the map.
    bp.record_once(set_up_host)
    job_path = f"/jobs/<{_JOB_ID_CONVERTER}:job_id>"
    answering = _answering(max_body)
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

    @bp.before_request
    @answering
    async def _guard() -> Response | None:  # None: go on to the route
        length = request.content_length
        if length is not None and length > _limit(max_body):
            return _too_large(_limit(max_body)).response()
        if expected is None or (request.endpoint or "").rpartition(".")[2] in _OPEN_ENDPOINTS:
            return None
        if is_ui_request():  # the dashboard checks its own session cookie
            return None
        given = request.headers.getlist("Authorization")
        # Exactly one header: with two, a proxy reading the last and this app the
        # first could disagree on who is asking.
        scheme, _, credential = given[0].partition(" ") if len(given) == 1 else ("", "", "")
        # The header arrives as latin-1 text; a token is ASCII, so .encode() can only fail to match.
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(), expected):
            # Drain a little of the body before answering: closing on a client
            # still sending makes the kernel reset the connection, which can
            # destroy the 401 before the client reads it. Only a little, thrown
            # away: a stranger gets no memory and no minute of a task.
            await _discard_some_body()
            headers = {"WWW-Authenticate": "Bearer", **_CLOSE}
            return _HTTPError(401, "missing or wrong bearer token", headers=headers).response()
        return None

    @bp.get("/healthz", **_EXACT)
    @answering
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @bp.get("/readyz", **_EXACT)
    @answering
    async def readyz() -> Response:
        ready, reason = queue.readiness()
        return _json({"ready": ready, "reason": reason}, 200 if ready else 503)

    @bp.get("/openapi.json", **_EXACT)
    @answering
    async def openapi() -> Response:
        return _json(openapi_spec())

    @bp.get("/stats", **_EXACT)
    @answering
    async def stats() -> Response:
        return _json(await queue.stats())

    @bp.get("/metrics", **_EXACT)
    @answering
    async def metrics_route() -> Response:
        metrics.stats = await queue.stats()
        return Response(generate_latest(registry), content_type="text/plain; version=0.0.4; charset=utf-8")

    @bp.post("/jobs", **_EXACT)
    @answering
    async def submit() -> Response:
        try:
            added = await queue.enqueue_many([_spec(await _body(max_body), "")])
        except KeyClash as exc:
            raise _HTTPError(409, str(exc), field=exc.field, kind="InvalidJob") from None
        return _json(_accepted(added, 0), 200 if added.existing else 202)

    @bp.post("/jobs/batch", **_EXACT)
    @answering
    async def submit_batch() -> Response:
        body = await _body(max_body)
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
            raise _HTTPError(400, 'body must be {"jobs": [...]}', field="jobs")
        if not body["jobs"]:
            raise _HTTPError(400, "jobs must not be empty", field="jobs")
        specs = [_spec(item, f"jobs[{index}].") for index, item in enumerate(body["jobs"])]
        try:
            jobs = await queue.enqueue_many(specs)
        except KeyClash as exc:
            field = exc.field if len(specs) > 1 or exc.field is None else f"jobs[0].{exc.field}"
            raise _HTTPError(409, str(exc), field=field, kind="InvalidJob") from None
        except UnknownTask as exc:
            missing = next(i for i, s in enumerate(specs) if s.task not in queue.registry)
            raise _HTTPError(400, str(exc), field=f"jobs[{missing}].task", kind="UnknownTask") from None
        except InvalidJob as exc:
            # The queue names a batch's fields jobs[i]. only when it holds more than one job.
            if len(specs) == 1 and exc.field is not None and not exc.field.startswith("jobs["):
                raise _HTTPError(400, f"jobs[0].{exc}", field=f"jobs[0].{exc.field}", kind="InvalidJob") from None
            raise
        new = len(jobs) - len(jobs.existing)
        return _json({"jobs": [_accepted(jobs, i) for i in range(len(jobs))]}, 202 if new else 200)

    @bp.get("/jobs", **_EXACT)
    @answering
    async def list_jobs() -> Response:
        args = request.args
        unknown = sorted(set(args) - _LIST_PARAMETERS)
        if unknown:
            raise _HTTPError(400, f"unknown query parameter {unknown[0]!r}", field=unknown[0])
        filters = {name: _one(args, name) for name in ("state", "task", "queue", "tenant")}
        limit = _count(_one(args, "limit"), 100)
        try:
            jobs = await queue.list(**filters, limit=limit, after_id=_one(args, "after"))
        except InvalidJob as exc:
            field = "after" if exc.field == "after_id" else exc.field
            raise _HTTPError(400, str(exc).replace("after_id", "after"), field=field, kind="InvalidJob") from None
        following = jobs[-1].id if len(jobs) == limit else None
        return _json({"jobs": [job.to_dict() for job in jobs], "next": following})

    @bp.post("/jobs/retry", **_EXACT)
    @answering
    async def retry_jobs() -> Response:
        return _json({"count": await queue.retry_many(**_bulk(await _body(max_body, empty={})))})

    @bp.post("/jobs/cancel", **_EXACT)
    @answering
    async def cancel_jobs() -> Response:
        return _json({"count": await queue.cancel_many(**_bulk(await _body(max_body, empty={})))})

    @bp.get(job_path, **_EXACT)
    @answering
    async def get_job(job_id: str) -> Response:
        job = await queue.get(job_id)
        body = job.to_dict()
        body["explain"] = (await queue.explain(job))["reasons"]
        return _json(body)

    @bp.delete(job_path, **_EXACT)
    @answering
    async def cancel_job(job_id: str) -> Response:
        return _json((await queue.cancel(job_id)).to_dict())

    @bp.post(f"{job_path}/retry", **_EXACT)
    @answering
    async def retry_job(job_id: str) -> Response:
        try:
            return _json((await queue.retry(job_id)).to_dict())
        except InvalidJob as exc:
            raise _HTTPError(409, str(exc), field=exc.field, kind="InvalidJob") from None

    @bp.post("/queues/<name>/pause", **_EXACT)
    @answering
    async def pause_queue(name: str) -> Response:
        changed = await queue.pause(name)
        return _json({"queue": name, "paused": True, "changed": changed})

    @bp.post("/queues/<name>/resume", **_EXACT)
    @answering
    async def resume_queue(name: str) -> Response:
        changed = await queue.resume(name)
        return _json({"queue": name, "paused": False, "changed": changed})

    bp.register_blueprint(ui_blueprint(queue, token=token), url_prefix="/ui")
    return bp


def create_app(queue: Queue, *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY) -> QuartTrio:
    """A Quart-Trio app serving :func:`blueprint` at the root.

    ``token`` and ``max_body`` are the blueprint's (``ValueError`` for an
    empty, blank or non-ASCII token). Beyond the blueprint, the app answers
    in the JSON error shape what no route takes (404, and 405 with
    ``Allow``) and whatever escapes the routes (a 500, logged on
    ``trioq.http``), and closes connections under hypercorn when it should
    (see ``_HTTPConnection``).
    """
    app = QuartTrio("trioq")
    app.asgi_http_class = _HTTPConnection
    app.config["MAX_CONTENT_LENGTH"] = max_body
    app.register_blueprint(blueprint(queue, token=token, max_body=max_body))

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        try:
            return _http_exception(error, max_body)
        except Exception as exc:  # a bug here must not become Quart's HTML page either
            return _internal_error(exc)

    return app
