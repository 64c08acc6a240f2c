"""Clients of a trioq service for producers that are not trio: the Queue's methods over HTTP.

:class:`Client` is synchronous (a Django view, a script, a thread); :class:`AsyncClient` runs under
asyncio and under trio alike (httpx picks the running loop). Both speak the routes of
:mod:`trioq.http` and give back what a :class:`~trioq.Queue` would: :class:`~trioq.Job` snapshots, and
the same trioq errors, named by the server's ``type`` field (``InvalidJob`` with its ``field``,
``UnknownTask``, ``JobNotFound``, ``QueueFull`` with its ``retry_after``). What has no trioq error of
its own (a wrong token, an unreachable server, a 500) raises :class:`~trioq.TrioqError` saying what
happened. ``wait`` polls ``GET /jobs/<id>``, from every 50 ms up to every second.

The HTTP side of each call is :class:`_Calls`'s (a request to send, an answer to read), so the two
clients differ only in how they send.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from ._model import InvalidJob, Job, JobNotFound, JobSpec, QueueFull, TrioqError, UnknownTask
from ._runtime.queue import WaitTimeout
from .stores._base import Added

__all__ = ["AsyncClient", "Client"]

#: ``wait``'s polls: the first after this many seconds, each next one 1.5 times later, at most every second.
_FIRST_POLL, _POLL_GROWTH, _LONGEST_POLL = 0.05, 1.5, 1.0
_ERRORS: dict[str, type[TrioqError]] = {
    "InvalidJob": InvalidJob,
    "UnknownTask": UnknownTask,
    "JobNotFound": JobNotFound,
    "QueueFull": QueueFull,
    "TrioqError": TrioqError,
}
_SPEC_DEFAULTS = JobSpec("")


def _spec_body(spec: JobSpec) -> dict[str, Any]:
    """A :class:`~trioq.JobSpec` as the JSON job object of ``POST /jobs`` (options left at their defaults
    are left out: the server fills them in from the task)."""
    body: dict[str, Any] = {"task": spec.task, "payload": spec.payload}
    for name in ("delay", "priority", "key", "max_attempts", "queue", "tenant", "deadline"):
        value = getattr(spec, name)
        if value != getattr(_SPEC_DEFAULTS, name):
            body[name] = value
    for name in ("limits", "after"):
        value = getattr(spec, name)
        if value:
            body[name] = list(value)
    return body


def _bulk(state: Any, task: Any, queue: Any, tenant: Any, limit: int) -> dict[str, Any]:
    """The body of ``POST /jobs/retry`` or ``/jobs/cancel``: the filters given."""
    body = {"state": getattr(state, "value", state), "task": task, "queue": queue, "tenant": tenant, "limit": limit}
    return {name: value for name, value in body.items() if value is not None}


class _Calls:
    """Requests and answers of each call, without I/O: ``(method, path, params, json)`` out, a Job in."""

    def __init__(self, url: str) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// address, got {url!r:.80}")
        try:
            httpx.URL(url)
        except httpx.InvalidURL as exc:  # not a ValueError: "http://[::1", a port out of range...
            raise ValueError(f"url {url!r:.80} is not a valid address: {exc}") from None
        self.url = url.rstrip("/")

    @staticmethod
    def job_path(job_id: str) -> str:
        """``/jobs/<id>``, the id one segment whatever it holds: its dots escaped too (``/jobs/./retry`` is
        ``/jobs/retry`` once an HTTP client removes dot segments: a retry of every dead job). An id no
        segment can carry (a ``/``: the server's routes take none; a lone surrogate) names no job."""
        if not isinstance(job_id, str) or not job_id:
            raise InvalidJob(f"job_id must be a non-empty string, got {job_id!r:.60}", field="job_id")
        if "/" in job_id or not _sendable(job_id):
            raise JobNotFound(f"no job with id {job_id!r:.80} (no job id holds a '/' or a lone surrogate)")
        return f"/jobs/{quote(job_id, safe='').replace('.', '%2E')}"

    @staticmethod
    def listing(state: Any, task: Any, queue: Any, tenant: Any, limit: int, after_id: str | None) -> dict[str, Any]:
        params = {"state": state, "task": task, "queue": queue, "tenant": tenant, "limit": limit, "after": after_id}
        out = {name: getattr(value, "value", value) for name, value in params.items() if value is not None}
        for name, value in out.items():
            if isinstance(value, str) and not _sendable(value):
                field = "after_id" if name == "after" else name
                raise InvalidJob(f"{field} {value!r:.60} holds a lone surrogate: no request can carry it", field=field)
        return out

    def answer(self, response: httpx.Response) -> Any:
        """The JSON of a 2xx answer; else the trioq error it names (or a :class:`~trioq.TrioqError`)."""
        if response.is_success:
            try:
                return response.json()
            except ValueError:  # a proxy's page, a truncated body...
                raise self.garbage(response, "a body that is not JSON") from None
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        message = str(body.get("error") or response.reason_phrase or "no reason given")
        kind = _ERRORS.get(str(body.get("type")))
        if kind is InvalidJob:
            field = body.get("field")
            raise InvalidJob(message, field=field if isinstance(field, str) else None)
        if kind is QueueFull:
            retry_after = body.get("retry_after")
            if isinstance(retry_after, bool) or not isinstance(retry_after, int | float) or not retry_after >= 0:
                retry_after = 1.0
            raise QueueFull(message, retry_after=float(retry_after))
        if kind is not None:
            raise kind(message)
        if response.status_code == 401:
            raise TrioqError(f"{self.url} refused the bearer token ({message}): pass token= the server's token")
        raise TrioqError(f"{self.url} answered {response.status_code}: {message}")

    def unreachable(self, exc: httpx.TransportError) -> TrioqError:
        return TrioqError(f"cannot reach {self.url}: {exc or type(exc).__name__}")

    def garbage(self, response: httpx.Response, what: str) -> TrioqError:
        """The error of a 2xx answer that is not what the route answers (a proxy's, another service's)."""
        return TrioqError(
            f"{self.url} answered {response.request.method} {response.request.url.path} with {what}:"
            " is it a trioq server (and the url its root)?"
        )

    def job(self, response: httpx.Response) -> Job:
        """The :class:`~trioq.Job` a 2xx answer holds, or :meth:`garbage`."""
        return self._jobs(response, [self.answer(response)], "a job")[0]

    def jobs(self, response: httpx.Response) -> builtins.list[Job]:
        """The jobs of a ``{"jobs": [...]}`` answer, or :meth:`garbage`."""
        body = self.answer(response)
        found = body.get("jobs") if isinstance(body, dict) else None
        if not isinstance(found, builtins.list):
            raise self.garbage(response, 'no "jobs" list')
        return self._jobs(response, found, "jobs")

    def added(self, response: httpx.Response) -> Added:
        """The jobs of a batch's answer as :meth:`Queue.enqueue_many <trioq.Queue.enqueue_many>` gives them:
        an :class:`~trioq.stores.Added` whose ``existing`` holds the indexes its keys found (``duplicate``)."""
        jobs = self.jobs(response)
        found = response.json()["jobs"]  # a list of job objects: jobs() checked it
        return Added(jobs, [i for i, item in enumerate(found) if item.get("duplicate") is True])

    def _jobs(self, response: httpx.Response, found: builtins.list[Any], what: str) -> builtins.list[Job]:
        try:
            return [Job.from_dict(job) for job in found]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise self.garbage(response, f"something that is not {what}") from None

    def count(self, response: httpx.Response) -> int:
        """The ``count`` of a bulk action's answer, or :meth:`garbage`."""
        body = self.answer(response)
        count = body.get("count") if isinstance(body, dict) else None
        if isinstance(count, bool) or not isinstance(count, int):
            raise self.garbage(response, 'no "count"')
        return count

    def mapping(self, response: httpx.Response) -> dict[str, Any]:
        """The JSON object of a 2xx answer (``/stats``), or :meth:`garbage`."""
        body = self.answer(response)
        if not isinstance(body, dict):
            raise self.garbage(response, "something that is not a JSON object")
        return body


def _sendable(text: str) -> bool:
    """Whether ``text`` can go in a request (UTF-8: no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _deadline(timeout: float | None) -> float:
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidJob(f"timeout must be a number >= 0 or None, got {timeout!r:.40}", field="timeout")
    return time.monotonic() + timeout


def _headers(token: str | None) -> dict[str, str]:
    """The bearer header of ``token``; ``ValueError`` for a token no server takes (as ``trioq.http``:
    printable ASCII without spaces), rather than an encoding error at the first call."""
    if token is None:
        return {}
    if not isinstance(token, str) or not token or any(not "!" <= char <= "~" for char in token):
        raise ValueError(f"token must be printable ASCII without spaces (as the server's is), got {token!r:.40}")
    return {"Authorization": f"Bearer {token}"}


class Client:
    """A trioq service's queue over HTTP, synchronous (see the module docs).

    ``url``: the service's address (``http://127.0.0.1:8000``, or where a blueprint is mounted);
    ``token``: its bearer token, if it has one; ``timeout``: seconds for each HTTP request;
    ``transport``: an ``httpx`` transport to use instead of the network (tests). Use it as a context
    manager, or call :meth:`close`.
    """

    def __init__(
        self, url: str, token: str | None = None, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._calls = _Calls(url)
        self._http = httpx.Client(
            base_url=self._calls.url, headers=_headers(token), timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client's connections."""
        self._http.close()

    def _send(self, method: str, path: str, *, params: Any = None, json: Any = None) -> httpx.Response:
        try:
            return self._http.request(method, path, params=params, json=json)
        except httpx.TransportError as exc:
            raise self._calls.unreachable(exc) from exc

    def enqueue(self, task: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
        """:meth:`Queue.enqueue <trioq.Queue.enqueue>` over HTTP: the same options, the job as enqueued."""
        return self._calls.job(self._send("POST", "/jobs", json=_spec_body(JobSpec(task, payload or {}, **options))))

    def enqueue_many(self, specs: Sequence[JobSpec]) -> Added:
        """:meth:`Queue.enqueue_many <trioq.Queue.enqueue_many>` over HTTP: all or nothing; as there, the
        list's ``existing`` holds the indexes of the specs whose key found a job."""
        return self._calls.added(self._send("POST", "/jobs/batch", json={"jobs": [_spec_body(spec) for spec in specs]}))

    def get(self, job_id: str) -> Job:
        """The job's snapshot; :class:`~trioq.JobNotFound` if the service holds no such job."""
        return self._calls.job(self._send("GET", self._calls.job_path(job_id)))

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """The job once it is terminal; :class:`~trioq.WaitTimeout` after ``timeout`` seconds."""
        deadline = _deadline(timeout)
        pause = _FIRST_POLL
        while not (job := self.get(job_id)).state.terminal:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"job {job_id} is still {job.state.value} after {timeout:g}s")
            time.sleep(min(pause, left))
            pause = min(pause * _POLL_GROWTH, _LONGEST_POLL)
        return job

    def cancel(self, job_id: str) -> Job:
        """Cancel the job unless it finished; the job as it is now."""
        return self._calls.job(self._send("DELETE", self._calls.job_path(job_id)))

    def retry(self, job_id: str) -> Job:
        """Run a dead or cancelled job again; :class:`~trioq.InvalidJob` (``field="state"``) otherwise."""
        return self._calls.job(self._send("POST", self._calls.job_path(job_id) + "/retry"))

    def list(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after_id: str | None = None,
    ) -> builtins.list[Job]:
        """:meth:`Queue.list <trioq.Queue.list>` over HTTP: a page, newest first."""
        params = self._calls.listing(state, task, queue, tenant, limit, after_id)
        return self._calls.jobs(self._send("GET", "/jobs", params=params))

    def retry_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """:meth:`Queue.retry_many <trioq.Queue.retry_many>` over HTTP: how many it retried."""
        return self._calls.count(self._send("POST", "/jobs/retry", json=_bulk(state, task, queue, tenant, limit)))

    def cancel_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """:meth:`Queue.cancel_many <trioq.Queue.cancel_many>` over HTTP: how many it cancelled."""
        return self._calls.count(self._send("POST", "/jobs/cancel", json=_bulk(state, task, queue, tenant, limit)))

    def stats(self) -> dict[str, Any]:
        """The service's :meth:`Queue.stats <trioq.Queue.stats>`."""
        return self._calls.mapping(self._send("GET", "/stats"))


class AsyncClient:
    """:class:`Client`'s calls as coroutines, under asyncio or trio (see the module docs). Use it as an
    async context manager, or await :meth:`aclose`."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._calls = _Calls(url)
        self._http = httpx.AsyncClient(
            base_url=self._calls.url, headers=_headers(token), timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._http.aclose()

    async def _send(self, method: str, path: str, *, params: Any = None, json: Any = None) -> httpx.Response:
        try:
            return await self._http.request(method, path, params=params, json=json)
        except httpx.TransportError as exc:
            raise self._calls.unreachable(exc) from exc

    async def enqueue(self, task: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
        """See :meth:`Client.enqueue`."""
        return self._calls.job(
            await self._send("POST", "/jobs", json=_spec_body(JobSpec(task, payload or {}, **options)))
        )

    async def enqueue_many(self, specs: Sequence[JobSpec]) -> Added:
        """See :meth:`Client.enqueue_many`."""
        body = {"jobs": [_spec_body(spec) for spec in specs]}
        return self._calls.added(await self._send("POST", "/jobs/batch", json=body))

    async def get(self, job_id: str) -> Job:
        """See :meth:`Client.get`."""
        return self._calls.job(await self._send("GET", self._calls.job_path(job_id)))

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """See :meth:`Client.wait`."""
        deadline = _deadline(timeout)
        pause = _FIRST_POLL
        while not (job := await self.get(job_id)).state.terminal:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"job {job_id} is still {job.state.value} after {timeout:g}s")
            await anyio.sleep(min(pause, left))
            pause = min(pause * _POLL_GROWTH, _LONGEST_POLL)
        return job

    async def cancel(self, job_id: str) -> Job:
        """See :meth:`Client.cancel`."""
        return self._calls.job(await self._send("DELETE", self._calls.job_path(job_id)))

    async def retry(self, job_id: str) -> Job:
        """See :meth:`Client.retry`."""
        return self._calls.job(await self._send("POST", self._calls.job_path(job_id) + "/retry"))

    async def list(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after_id: str | None = None,
    ) -> builtins.list[Job]:
        """See :meth:`Client.list`."""
        params = self._calls.listing(state, task, queue, tenant, limit, after_id)
        return self._calls.jobs(await self._send("GET", "/jobs", params=params))

    async def retry_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """See :meth:`Client.retry_many`."""
        return self._calls.count(await self._send("POST", "/jobs/retry", json=_bulk(state, task, queue, tenant, limit)))

    async def cancel_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """See :meth:`Client.cancel_many`."""
        body = _bulk(state, task, queue, tenant, limit)
        return self._calls.count(await self._send("POST", "/jobs/cancel", json=body))

    async def stats(self) -> dict[str, Any]:
        """See :meth:`Client.stats`."""
        return self._calls.mapping(await self._send("GET", "/stats"))
