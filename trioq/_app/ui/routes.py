"""The dashboard's routes: pages (GET), actions (POST, then a redirect), login and logout.

Mounted by :func:`trioq._app.http.blueprint` under ``/ui``::

    GET  /ui                       overview: jobs per state and per queue, throughput, workers,
                                   limits, queues (with Pause / Resume)
    GET  /ui/jobs                  the jobs, newest first: ?state=&task=&queue=&tenant=&after=
    GET  /ui/jobs/<id>             one job: payload, result, errors, parents, children, timeline,
                                   why it is not running; Retry / Cancel
    POST /ui/jobs/<id>/retry       queue.retry, then back to the job
    POST /ui/jobs/<id>/cancel      queue.cancel, then back to the job
    POST /ui/queues/pause          queue.pause(form's "queue"), then back to "next" (or the overview)
    POST /ui/queues/resume         queue.resume, likewise
    GET  /ui/login, POST /ui/login the login form (a password field holding the API token)
    POST /ui/logout                forget the session
    GET  /ui/static/<name>         ui.css, ui.js

With a token, every page but the login form and the static files needs a
logged-in session; without one, the dashboard is open and a session is made
on the first page view. Every POST but the login needs the session's CSRF
token in its ``csrf`` field (403 otherwise). Actions answer ``303 See Other``
to a page that shows what happened. These routes are exempt from the JSON
API's bearer check, and their errors are HTML pages, not the JSON shape.
"""

from __future__ import annotations

import functools
import logging
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Concatenate, ParamSpec

import trio
from quart import Blueprint, Response, current_app, request, url_for
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..._model import InvalidJob, JobNotFound, TrioqError
from ..._runtime.queue import Queue
from . import history as history_module
from . import views
from .render import HEADERS, page
from .sessions import COOKIE, LIFETIME, Session, Sessions, token_matches

__all__ = ["NAME", "PAGE_SIZE", "is_ui_request", "ui_blueprint"]

#: The blueprint's name (under the API's blueprint, its endpoints are ``trioq.trioq_ui.*``).
NAME = "trioq_ui"
#: Jobs per page of the list.
PAGE_SIZE = 50
#: Largest form body accepted, in bytes (a form holds a token, an id, a queue name).
MAX_FORM = 16 * 1024
_STATIC = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}

_logger = logging.getLogger("trioq.http")
_P = ParamSpec("_P")


def is_ui_request() -> bool:
    """Whether the current request was routed to the dashboard (the API's bearer check skips it)."""
    blueprints = request.blueprints
    return bool(blueprints) and blueprints[0].rpartition(".")[2] == NAME


class _Refused(Exception):
    """A request answered with an error page: ``status`` and a message for a person."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _error_page(status: int, message: str, session: Session | None = None) -> Response:
    """An HTML error page with ``status``; with a ``session``, its navigation and messages too."""
    return page("error.html", status, status=status, message=message, session=session, **_common())


def _common() -> dict[str, Any]:
    """What every template may use: ``url`` (Quart's ``url_for``: ``.name`` is this blueprint's) and the states."""
    return {"url": url_for, "states": views.STATES}


def _root() -> str:
    """The overview's path (``/ui``, or under the host's prefix): the cookie's path."""
    return url_for(f"{request.blueprint}.overview")


#: What :func:`_safe_next` leaves as is in a target: ASCII a URL may hold (``%`` too: escapes stay escapes).
_URL_SAFE = "!#$%&'()*+,/:;=?@[]~"


def _safe_next(target: str | None, fallback: str) -> str:
    """``target`` if it is a path inside the dashboard (no scheme, no host), else ``fallback``.

    It goes out as a ``Location`` header: a target holding a control character (CR LF would split the
    header, NUL makes the server refuse the response) is never one the dashboard made, so it is
    ``fallback`` too; other characters a header cannot carry as they are (non-ASCII, spaces) are
    percent-encoded."""
    if not target or "\\" in target or any(char < " " or char == "\x7f" for char in target):
        return fallback  # a backslash: browsers read "/\host" as "//host"
    target = urllib.parse.quote(target.encode("utf-8", "backslashreplace"), safe=_URL_SAFE)
    parts = urllib.parse.urlsplit(target)
    root = _root()
    inside = parts.path == root or parts.path.startswith(root + "/")
    if parts.scheme or parts.netloc or not inside or target.startswith("//"):
        return fallback
    return target


def _see_other(target: str) -> Response:
    """A ``303 See Other`` to ``target``: after a POST, the browser GETs the page that says what happened."""
    return Response("", status=303, headers={**HEADERS, "Location": target})


def _set_cookie(response: Response, session: Session) -> None:
    """Send the session's id: ``HttpOnly``, ``SameSite=Strict``, for the dashboard's path only, ``Secure``
    when the request came over https, for the session's :data:`LIFETIME`."""
    response.set_cookie(
        COOKIE,
        session.id,
        max_age=int(LIFETIME),
        path=_root(),
        secure=request.scheme in ("https", "wss"),
        httponly=True,
        samesite="Strict",
    )


async def _read_form() -> dict[str, str]:
    """The urlencoded form of a POST: each field's first value. 415 for another body type, 413 past
    :data:`MAX_FORM` bytes, 400 past 20 fields, 408 if the body is slower than the app's ``BODY_TIMEOUT``."""
    if request.mimetype != "application/x-www-form-urlencoded":
        raise _Refused(415, "expected a form (application/x-www-form-urlencoded)")
    parts: list[bytes] = []
    size = 0
    timeout = request.body_timeout
    with trio.move_on_after(timeout if timeout is not None else 60) as scope:
        async for part in request.body:
            size += len(part)
            if size > MAX_FORM:
                raise _Refused(413, f"form over {MAX_FORM} bytes")
            parts.append(part)
    if scope.cancelled_caught:
        raise _Refused(408, "the form did not arrive in time")
    try:
        fields = urllib.parse.parse_qs(
            b"".join(parts).decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=20
        )
    except ValueError:  # over max_num_fields
        raise _Refused(400, "a form of over 20 fields") from None
    return {name: values[0] for name, values in fields.items()}


def ui_blueprint(queue: Queue, *, token: str | None) -> Blueprint:
    """The dashboard of ``queue`` as a blueprint; ``token`` is the API's (already checked), ``None``:
    open. It samples the queue's totals while the host app serves (a QuartTrio app: in its nursery)."""
    bp = Blueprint(NAME, __name__)
    sessions = Sessions()
    history = history_module.History()
    samplers: list[trio.CancelScope] = []

    async def sample() -> None:
        """Sample into ``history`` until cancelled by :func:`stop_sampling` (or the queue closes)."""
        with trio.CancelScope() as scope:
            samplers.append(scope)
            try:
                await history_module.sample_forever(queue, history)
            finally:
                samplers.remove(scope)

    @bp.before_app_serving
    async def start_sampling() -> None:
        """When the host app starts serving: start sampling in its nursery."""
        if isinstance(current_app, QuartTrio):  # a plain Quart app has no nursery: no chart
            current_app.nursery.start_soon(sample)

    @bp.after_app_serving
    async def stop_sampling() -> None:
        """When it stops: stop sampling, so that the app's nursery need not wait for it."""
        for scope in samplers:
            scope.cancel()

    def viewing(
        view: Callable[Concatenate[Session, _P], Awaitable[Response]],
    ) -> Callable[_P, Awaitable[Response]]:
        """A page: needs a logged-in session (or makes one when there is no token)."""

        @functools.wraps(view)
        async def route(*args: _P.args, **kwargs: _P.kwargs) -> Response:
            session = sessions.get(request.cookies.get(COOKIE))
            fresh = False
            if session is None:
                if token is not None:
                    return _see_other(url_for(".login", next=request.full_path.rstrip("?")))
                session, fresh = sessions.new(), True
            response = await _answering(session, view(session, *args, **kwargs))
            if fresh:
                _set_cookie(response, session)
            return response

        return route

    def acting(
        action: Callable[Concatenate[Session, dict[str, str], _P], Awaitable[str]],
    ) -> Callable[_P, Awaitable[Response]]:
        """A POST action: a logged-in session and its CSRF token, then a redirect to where it says."""

        @functools.wraps(action)
        async def route(*args: _P.args, **kwargs: _P.kwargs) -> Response:
            session = sessions.get(request.cookies.get(COOKIE))
            if session is None:
                if token is not None:
                    return _see_other(url_for(".login"))
                return _error_page(403, "no session: load the page again and repeat the action")

            async def act() -> Response:
                form = await _read_form()
                if not session.csrf_ok(form.get("csrf")):
                    raise _Refused(403, "the form's CSRF token is missing or wrong: load the page again")
                return _see_other(await action(session, form, *args, **kwargs))

            return await _answering(session, act())

        return route

    # ------------------------------------------------------------- pages

    @bp.get("")
    @viewing
    async def overview(session: Session) -> Response:
        """``GET /ui``: the overview (see :func:`.views.overview`) and the throughput chart."""
        found = await views.overview(queue)
        return page(
            "overview.html",
            session=session,
            token_set=token is not None,
            o=found,
            chart=history_module.chart(history),
            every=history_module.SAMPLE_EVERY,
            count_up_to=views.COUNT_UP_TO,
            **_common(),
        )

    @bp.get("/jobs")
    @viewing
    async def jobs(session: Session) -> Response:
        """``GET /ui/jobs``: a page of :data:`PAGE_SIZE` jobs, newest first, after ``after``; a filter the
        queue refuses (``InvalidJob``) is a 400 page that says why, with the form to fix it."""
        args = request.args
        filters = {name: args.get(name) or None for name in ("state", "task", "queue", "tenant")}
        after = args.get("after") or None
        problem, found, status = None, [], 200
        try:
            found = await queue.list(**filters, limit=PAGE_SIZE, after_id=after)
        except InvalidJob as exc:
            problem, status = str(exc), 400
        following = found[-1].id if len(found) == PAGE_SIZE else None
        tasks = sorted(queue.registry)
        queues = sorted({queue.registry[name].queue for name in tasks})
        return page(
            "jobs.html",
            status,
            session=session,
            token_set=token is not None,
            jobs=found,
            filters=filters,
            filters_given={name: value for name, value in filters.items() if value is not None},
            after=after,
            following=following,
            problem=problem,
            tasks=tasks,
            queues=queues,
            **_common(),
        )

    @bp.get("/jobs/<job_id>")
    @viewing
    async def job(session: Session, job_id: str) -> Response:
        """``GET /ui/jobs/<id>``: one job (404 if the store does not hold it)."""
        found = await views.job_page(queue, job_id)
        return page(
            "job.html", session=session, token_set=token is not None, p=found, scan=views.CHILD_SCAN, **_common()
        )

    # ----------------------------------------------------------- actions

    @bp.post("/jobs/<job_id>/retry")
    @acting
    async def retry(session: Session, form: dict[str, str], job_id: str) -> str:
        """``queue.retry``; a job that is not dead or cancelled is said so on the job's page."""
        try:
            done = await queue.retry(job_id)
            session.say("ok", f"Job {done.id} is {done.state.value} again (attempts reset).")
        except (InvalidJob, JobNotFound) as exc:
            session.say("error", f"Not retried: {exc}")
        return url_for(".job", job_id=job_id)

    @bp.post("/jobs/<job_id>/cancel")
    @acting
    async def cancel(session: Session, form: dict[str, str], job_id: str) -> str:
        """``queue.cancel``; a job that had already ended is said so on the job's page."""
        try:
            before = await queue.get(job_id)
            done = await queue.cancel(job_id)
            if before.state.terminal:
                session.say("error", f"Not cancelled: the job had already ended ({done.state.value}).")
            else:
                session.say("ok", f"Job {done.id} is {done.state.value}.")
        except JobNotFound as exc:
            session.say("error", f"Not cancelled: {exc}")
        return url_for(".job", job_id=job_id)

    async def pausing(session: Session, form: dict[str, str], pause: bool) -> str:
        """Pause or resume the form's ``queue``, then back to its ``next`` (inside the dashboard) or the overview."""
        name = form.get("queue", "")
        try:
            changed = await (queue.pause(name) if pause else queue.resume(name))
            verb = "paused" if pause else "resumed"
            session.say("ok", f"Queue {name} {verb}." if changed else f"Queue {name} was {verb} already.")
        except InvalidJob as exc:
            session.say("error", f"Queue not changed: {exc}")
        return _safe_next(form.get("next"), url_for(".overview"))

    @bp.post("/queues/pause")
    @acting
    async def pause(session: Session, form: dict[str, str]) -> str:
        """``POST /ui/queues/pause``."""
        return await pausing(session, form, True)

    @bp.post("/queues/resume")
    @acting
    async def resume(session: Session, form: dict[str, str]) -> str:
        """``POST /ui/queues/resume``."""
        return await pausing(session, form, False)

    # ------------------------------------------------------------- login

    @bp.get("/login")
    async def login() -> Response:
        """``GET /ui/login``: the form (without a token there is nothing to log in to: the overview)."""
        if token is None:
            return _see_other(url_for(".overview"))
        target = _safe_next(request.args.get("next"), url_for(".overview"))
        return page("login.html", session=None, token_set=True, next=target, problem=None, **_common())

    @bp.post("/login")
    async def login_post() -> Response:
        """``POST /ui/login``: the right token makes a new session (the old one, if any, is forgotten) and
        goes to ``next``; a wrong one is a 401 with the form again."""
        if token is None:
            return _see_other(url_for(".overview"))
        try:
            form = await _read_form()
        except _Refused as exc:
            return _error_page(exc.status, exc.message)
        target = _safe_next(form.get("next"), url_for(".overview"))
        if not token_matches(form.get("token", ""), token):
            problem = "Wrong token."
            return page("login.html", 401, session=None, token_set=True, next=target, problem=problem, **_common())
        old = request.cookies.get(COOKIE)
        if old:
            sessions.forget(old)
        response = _see_other(target)
        _set_cookie(response, sessions.new())
        return response

    @bp.post("/logout")
    @acting
    async def logout(session: Session, form: dict[str, str]) -> str:
        """``POST /ui/logout``: forget the session server-side."""
        sessions.forget(session.id)
        return url_for(".login") if token is not None else url_for(".overview")

    @bp.get("/static/<name>")
    async def static(name: str) -> Response:
        """``GET /ui/static/<name>``: ``ui.css`` or ``ui.js``, open to all (the login page needs them)."""
        if name not in _STATIC:
            return _error_page(404, f"no file {name}")
        headers = {**HEADERS, "Cache-Control": "public, max-age=300"}
        return Response(_static_file(name), headers=headers, content_type=_STATIC[name])

    return bp


async def _answering(session: Session | None, pending: Awaitable[Response]) -> Response:
    """The response ``pending`` makes, or an error page: a 404 for an unknown job, the status of a
    refused request, a 503 while the queue shuts down, a logged 500 (with a reference) for a bug."""
    try:
        return await pending
    except _Refused as exc:
        return _error_page(exc.status, exc.message, session)
    except JobNotFound as exc:
        return _error_page(404, str(exc), session)
    except HTTPException as exc:
        return _error_page(exc.code or 500, exc.description or exc.name, session)
    except TrioqError as exc:
        if type(exc) is TrioqError:  # what a closing queue raises
            return _error_page(503, str(exc), session)
        return _bug(exc, session)
    except Exception as exc:
        return _bug(exc, session)


def _bug(exc: Exception, session: Session | None) -> Response:
    """A 500 page naming a reference; the traceback goes to the ``trioq.http`` log under it, never to the page."""
    reference = secrets.token_hex(4)
    _logger.error(
        "unhandled error answering %s %s (reference %s)",
        request.method,
        request.path,
        reference,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return _error_page(500, f"Internal error (reference {reference}); the server log has the details.", session)


@functools.cache
def _static_file(name: str) -> bytes:
    """The bytes of ``static/<name>`` in this package (read once)."""
    return resources.files(__package__).joinpath("static", name).read_bytes()
