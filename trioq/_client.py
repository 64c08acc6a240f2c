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
        self.url = url.rstrip("/")

    @staticmethod
    def job_path(job_id: str) -> str:
        if not isinstance(job_id, str) or not job_id:
            raise InvalidJob(f"job_id must be a non-empty string, got {job_id!r:.60}", field="job_id")
        return f"/jobs/{quote(job_id, safe='')}"

    @staticmethod
    def listing(state: Any, task: Any, queue: Any, tenant: Any, limit: int, after_id: str | None) -> dict[str, Any]:
        params = {"state": state, "task": task, "queue": queue, "tenant": tenant, "limit": limit, "after": after_id}
        return {name: getattr(value, "value", value) for name, value in params.items() if value is not None}

    def answer(self, response: httpx.Response) -> Any:
        """The JSON of a 2xx answer; else the trioq error it names (or a :class:`~trioq.TrioqError`)."""
        if response.is_success:
            return response.json()
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        message = str(body.get("error") or response.reason_phrase or "no reason given")
        kind = _ERRORS.get(str(body.get("type")))
        if kind is InvalidJob:
            raise InvalidJob(message, field=body.get("field"))
        if kind is QueueFull:
            raise QueueFull(message, retry_after=float(body.get("retry_after", 1.0)))
        if kind is not None:
            raise kind(message)
        if response.status_code == 401:
            raise TrioqError(f"{self.url} refused the bearer token ({message}): pass token= the server's token")
        raise TrioqError(f"{self.url} answered {response.status_code}: {message}")

    def unreachable(self, exc: httpx.TransportError) -> TrioqError:
        return TrioqError(f"cannot reach {self.url}: {exc or type(exc).__name__}")


def _deadline(timeout: float | None) -> float:
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidJob(f"timeout must be a number >= 0 or None, got {timeout!r:.40}", field="timeout")
    return time.monotonic() + timeout


def _headers(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


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

    def _send(self, method: str, path: str, *, params: Any = None, json: Any = None) -> Any:
        try:
            response = self._http.request(method, path, params=params, json=json)
        except httpx.TransportError as exc:
            raise self._calls.unreachable(exc) from exc
        return self._calls.answer(response)

    def enqueue(self, task: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
        """:meth:`Queue.enqueue <trioq.Queue.enqueue>` over HTTP: the same options, the job as enqueued."""
        return Job.from_dict(self._send("POST", "/jobs", json=_spec_body(JobSpec(task, payload or {}, **options))))

    def enqueue_many(self, specs: Sequence[JobSpec]) -> builtins.list[Job]:
        """:meth:`Queue.enqueue_many <trioq.Queue.enqueue_many>` over HTTP: all or nothing."""
        body = self._send("POST", "/jobs/batch", json={"jobs": [_spec_body(spec) for spec in specs]})
        return [Job.from_dict(job) for job in body["jobs"]]

    def get(self, job_id: str) -> Job:
        """The job's snapshot; :class:`~trioq.JobNotFound` if the service holds no such job."""
        return Job.from_dict(self._send("GET", self._calls.job_path(job_id)))

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
        return Job.from_dict(self._send("DELETE", self._calls.job_path(job_id)))

    def retry(self, job_id: str) -> Job:
        """Run a dead or cancelled job again; :class:`~trioq.InvalidJob` (``field="state"``) otherwise."""
        return Job.from_dict(self._send("POST", self._calls.job_path(job_id) + "/retry"))

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
        return [Job.from_dict(job) for job in self._send("GET", "/jobs", params=params)["jobs"]]

    def retry_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """:meth:`Queue.retry_many <trioq.Queue.retry_many>` over HTTP: how many it retried."""
        count: int = self._send("POST", "/jobs/retry", json=_bulk(state, task, queue, tenant, limit))["count"]
        return count

    def cancel_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """:meth:`Queue.cancel_many <trioq.Queue.cancel_many>` over HTTP: how many it cancelled."""
        count: int = self._send("POST", "/jobs/cancel", json=_bulk(state, task, queue, tenant, limit))["count"]
        return count

    def stats(self) -> dict[str, Any]:
        """The service's :meth:`Queue.stats <trioq.Queue.stats>`."""
        stats: dict[str, Any] = self._send("GET", "/stats")
        return stats


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

    async def _send(self, method: str, path: str, *, params: Any = None, json: Any = None) -> Any:
        try:
            response = await self._http.request(method, path, params=params, json=json)
        except httpx.TransportError as exc:
            raise self._calls.unreachable(exc) from exc
        return self._calls.answer(response)

    async def enqueue(self, task: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
        """See :meth:`Client.enqueue`."""
        body = await self._send("POST", "/jobs", json=_spec_body(JobSpec(task, payload or {}, **options)))
        return Job.from_dict(body)

    async def enqueue_many(self, specs: Sequence[JobSpec]) -> builtins.list[Job]:
        """See :meth:`Client.enqueue_many`."""
        body = await self._send("POST", "/jobs/batch", json={"jobs": [_spec_body(spec) for spec in specs]})
        return [Job.from_dict(job) for job in body["jobs"]]

    async def get(self, job_id: str) -> Job:
        """See :meth:`Client.get`."""
        return Job.from_dict(await self._send("GET", self._calls.job_path(job_id)))

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
        return Job.from_dict(await self._send("DELETE", self._calls.job_path(job_id)))

    async def retry(self, job_id: str) -> Job:
        """See :meth:`Client.retry`."""
        return Job.from_dict(await self._send("POST", self._calls.job_path(job_id) + "/retry"))

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
        return [Job.from_dict(job) for job in (await self._send("GET", "/jobs", params=params))["jobs"]]

    async def retry_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """See :meth:`Client.retry_many`."""
        body = await self._send("POST", "/jobs/retry", json=_bulk(state, task, queue, tenant, limit))
        count: int = body["count"]
        return count

    async def cancel_many(
        self,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """See :meth:`Client.cancel_many`."""
        body = await self._send("POST", "/jobs/cancel", json=_bulk(state, task, queue, tenant, limit))
        count: int = body["count"]
        return count

    async def stats(self) -> dict[str, Any]:
        """See :meth:`Client.stats`."""
        stats: dict[str, Any] = await self._send("GET", "/stats")
        return stats
