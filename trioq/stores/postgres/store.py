"""PostgresStore: the Store protocol in SQL, one queue shared by every node on a database.

Calls run psycopg's sync API in worker threads, on a connection pool
(psycopg_pool); see ``_transitions`` for the SQL and ``docs/postgres.md``
for indexes, vacuum and sizes.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import attrs
import trio

from ..._model import Job, JobNotFound, JobState, Limit, label_problem
from ..._validate import label, number
from .._base import (
    Added,
    CancelResult,
    ClaimRequest,
    Failed,
    IdMaker,
    JobFilter,
    NewJob,
    Outcome,
    Released,
    Snoozed,
    StoreConfig,
    Succeeded,
    key_clash,
    no_limits,
)
from ..table.store import _checked
from . import _admin, _cron, _defer, _flows, _handoff, _limits, _listing
from . import _transitions as sql
from ._gather import Gatherer
from ._listener import listen
from ._rows import encode_payload, loads
from ._schema import SCHEMA_VERSION, check_schema_name, current_version, ensure_fair_index, migrate

__all__ = ["PostgresStore"]

T = TypeVar("T")
#: A job on its way in: its id, the checked job, its payload as JSON.
_Row = tuple[str, NewJob, str]
_log = logging.getLogger("trioq.postgres")

#: Seconds the leader's row is held without renewal (at most half the store's lease); renewed every third of it.
LEADER_TTL = 10.0
#: At most one NOTIFY of each kind per this many seconds per store (the rest are coalesced).
NOTIFY_EVERY = 0.002
#: How long opening a session waits for the database's first connection.
OPEN_TIMEOUT = 15.0
#: How long a call keeps retrying while the database cannot be reached (a restart, a failover).
OUTAGE = 60.0
#: How long closing a session waits for the adds in flight before it releases the node's jobs.
ADDS_AT_CLOSE = 10.0
_READY, _SCHEDULED, _DEFERRED, _RUNNING = JobState.READY, JobState.SCHEDULED, JobState.DEFERRED, JobState.RUNNING
_OUTCOMES = (Succeeded, Failed, Released, Snoozed)
#: Seconds between sweeps of run-out rate states, and how far before now a swept ``tat`` must lie
#: (so that nodes whose clocks run up to that far behind still find the rows that matter to them).
_RATE_SWEEP_EVERY = 60.0
_RATE_SWEEP_MARGIN = 600.0
#: No bitmap scans on trioq's own connections. Before the table's first ANALYZE (a new schema, a
#: sudden backlog) the planner takes the ready index for a few rows and answers a claim with a
#: bitmap scan and a sort of every ready job: 25 ms per claim at 20,000, against 2.6 ms in index
#: order. Every statement trioq runs is an index lookup, a range in index order, or a full scan.
#: No JIT either: a fair claim's skip scan (a recursive CTE) is estimated past ``jit_above_cost`` at a few
#: tenants, and compiling it took 150 ms of a statement that runs in 0.3 ms. No statement of trioq's
#: runs long enough to gain from it.
_PLANNER = "-c enable_bitmapscan=off -c jit=off"
#: The pool's ``prepare_threshold``: a statement is prepared only when its call asks (``prepare=True``, see
#: ``_transitions.PREPARED_BATCH``); ``None`` would refuse even that, and every other call says ``prepare=False``.
_PREPARE_ASKED = 2**31 - 1
#: libpq's TCP keepalives: a connection whose peer went silent fails within about 40 s.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 6}


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError("PostgresStore needs psycopg 3 and psycopg_pool: pip install 'trioq[postgres]'") from None
    return psycopg


def _usable_id(job_id: object) -> bool:
    """Whether ``job_id`` can name a row (PostgreSQL's text holds no NUL)."""
    if not isinstance(job_id, str) or "\x00" in job_id:
        return False
    try:
        job_id.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


#: SQLSTATE classes of errors worth retrying: the connection (08), the server shutting down or
#: starting (57), a transaction that lost a deadlock or a serialization race (40).
_TRANSIENT_CLASSES = ("08", "57", "40")


def _transient(exc: BaseException) -> bool:
    """Whether ``exc`` (a psycopg ``OperationalError``) says the database was out of reach, not that the
    statement was wrong: a broken connection has no SQLSTATE, or one of :data:`_TRANSIENT_CLASSES`;
    the pool's timeout waiting for a connection counts too."""
    state = getattr(exc, "sqlstate", None)
    if state == "57014":  # query_canceled (a statement_timeout): the same statement would fail again
        return False
    return state is None or state[:2] in _TRANSIENT_CLASSES


def _usable_epoch(epoch: object) -> bool:
    return isinstance(epoch, int) and not isinstance(epoch, bool) and -(2**63) <= epoch < 2**63


def _thread_clock(clock: Callable[[], float]) -> Callable[[], float]:
    """``clock`` (``StoreConfig.clock``) for a worker thread of a call: called there directly, or through
    trio (``trio.from_thread``) if it needs trio's context (a clock that reads ``trio.current_time()``
    raises ``RuntimeError`` outside it). A claim reads it while it holds a key's locks."""

    def read() -> float:
        try:
            return clock()
        except RuntimeError:
            return float(trio.from_thread.run_sync(clock))

    return read


class PostgresStore:
    """A :class:`~trioq.stores.Store` in a PostgreSQL database, shared by every queue that opens it.

    Every ``open_queue`` on the same database and ``schema`` is a node of one
    queue: jobs enqueued by any run on any. ``lease``: seconds a node's
    running jobs stay its own without renewal (the runtime renews every
    third of it); a node whose lease lapses (a crash, a lost network) is
    dead, and the leader rescues its jobs (ready again, uncounted). One
    node at a time leads (a row with a lease of its own); it runs rescue and
    eviction.

    The schema is created, or migrated, when a session opens (under an
    advisory lock, so nodes opening at once are safe); ``migrate=False``
    refuses to open a schema that is missing or older instead (run ``trioq
    pg migrate DSN``). ``max_connections`` bounds this store's pool (one more
    connection listens for hints). Timestamps come from the runtime's clock
    (keep the machines' clocks in sync, as for any lease). While the
    database cannot be reached each call retries for up to a minute, then
    raises.

    A store object serves one session at a time; give each queue its own
    (many may share one database).
    """

    #: Every call is a round trip: the runtime batches outcomes.
    batch_outcomes = True

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "trioq",
        lease: float = 30.0,
        migrate: bool = True,
        max_connections: int = 10,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise TypeError(f"dsn must be a libpq connection string or URL, got {dsn!r:.80}")
        self.dsn = dsn
        self.schema = check_schema_name(schema)
        self.lease = number("lease", lease, above=True, error=ValueError)
        if not isinstance(migrate, bool):
            raise TypeError(f"migrate must be True or False, got {migrate!r}")
        self.migrate = migrate
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 2:
            raise ValueError(f"max_connections must be an int >= 2, got {max_connections!r}")
        self.max_connections = max_connections
        #: The NOTIFY channel of this schema's hints.
        self.channel = f"trioq_{self.schema}"
        _psycopg()
        self._ids = IdMaker(width=10)
        self._config: StoreConfig | None = None
        self._pool: Any = None
        self._limiter = trio.CapacityLimiter(max_connections)
        self._leading = False
        #: A leader that dies is replaced well before the nodes it leaves behind lapse.
        self.leader_ttl = min(LEADER_TTL, self.lease / 2)
        self._lease_until = -math.inf
        self._claims = 0
        #: The earliest run_at of a scheduled job, or deadline of a never-claimed one, this store knows of:
        #: a claim past it promotes (and expires) first.
        self._due = math.inf
        #: The queues this store believes paused (its own pauses, and what promote read): while any is,
        #: a claim of every queue walks the queues instead of reading ``jobs_ready`` past their jobs.
        #: Only the plan depends on it; every claim reads the pauses themselves.
        self._paused_known: set[str] = set()
        #: Claim tokens of adds that may have claimed jobs and then failed (see :meth:`_insert`): a claim
        #: takes them, finds any such job running under this node and hands it to ``on_claimed``.
        self._unsure: set[str] = set()
        #: Idle workers, by queue as ``takers()`` keys them, that a statement in flight may claim for (an add's,
        #: a success's): the other one does not claim for them too.
        self._reserved: dict[str | None, int] = {}
        #: Whether a deadline may be pending (one of this node's, or one promote or a claim saw): claims
        #: then read the next deadline too, to hear of other nodes' in time.
        self._deadlines_used = False
        #: When evict() next sweeps the run-out rate states (wall clock).
        self._next_rate_sweep = -math.inf
        self._claim_queues: tuple[object, list[str] | None] = (None, None)
        #: Whether a success may complete a parent (one has, or this store added a child): completions then
        #: use the statement that also releases children (see ``_transitions._succeed_all``); without
        #: flows, the smaller one.
        self._parents = False
        #: The results of the parents of the jobs this store claimed, until their children ask (``results``).
        self._parent_results = _handoff.ParentResults()
        self._last_notify = -math.inf
        self._pending_ready = 0
        self._notify_wanted: trio.Event | None = None
        self._fetch: trio.MemorySendChannel[list[str]] | None = None
        self._gatherer: Gatherer[_Row, tuple[Job | None, float, str]] | None = None

    def __repr__(self) -> str:
        return f"PostgresStore(schema={self.schema!r}, lease={self.lease!r})"

    # ------------------------------------------------------------ plumbing

    def _open(self) -> StoreConfig:
        config = self._config
        if config is None:
            raise RuntimeError("this PostgresStore is not open; use it through trioq.open_queue")
        return config

    async def _call(self, fn: Callable[..., T], *args: Any, retried: bool = False, **options: Any) -> T:
        """Run ``fn(conn, schema, *args, **options)`` in a worker thread on a pooled connection (see
        :meth:`_run`).

        ``retried``: ``fn`` takes a ``retried`` keyword, true on a try after a
        broken connection (see ``_transitions``). Not a cancel point: once the
        statement is sent, its outcome is waited for.
        """
        return await trio.to_thread.run_sync(self._run, fn, args, retried, options, limiter=self._limiter)

    def _run(
        self, fn: Callable[..., T], args: tuple[Any, ...], aware: bool = False, options: Mapping[str, Any] = {}
    ) -> T:
        """``fn(conn, schema, *args)``, retried while the database cannot be reached, for up to :data:`OUTAGE`.

        Errors that say the connection broke, the server is shutting down, or
        the transaction lost a deadlock are retried (with ``aware``, ``fn``
        is told, so that a transition that committed before its connection
        broke answers as it would have); any other error is raised at once.
        """
        psycopg = _psycopg()
        give_up = time.monotonic() + OUTAGE
        backoff = 0.02
        tries = 0
        while True:
            tries += 1
            try:
                with self._pool.connection() as conn:
                    if aware:
                        return fn(conn, self.schema, *args, retried=tries > 1, **options)
                    return fn(conn, self.schema, *args, **options)
            except psycopg.OperationalError as exc:
                if not _transient(exc) or time.monotonic() > give_up:
                    raise
                _log.warning("trioq: PostgreSQL call %s failed (%s); retrying", fn.__name__, exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _connect(self) -> Any:
        """The listener's connection; TCP keepalives notice a peer gone silent (a dropped NAT entry)."""
        psycopg = _psycopg()
        return psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None, **_KEEPALIVES)

    # ------------------------------------------------------------ session

    @asynccontextmanager
    async def session(self, config: StoreConfig) -> AsyncIterator[None]:
        if self._config is not None:
            raise RuntimeError(
                "this PostgresStore is already open by another queue; give each queue its own PostgresStore "
                "(many may share one database)"
            )
        from psycopg_pool import ConnectionPool

        self._config = config
        # What was due, paused or used before is not known: the first claim promotes first, and learns.
        self._due = -math.inf
        self._paused_known = set()
        self._deadlines_used = False
        self._next_rate_sweep = -math.inf
        pool = ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self.max_connections,
            kwargs={"autocommit": True, "prepare_threshold": _PREPARE_ASKED, "options": _PLANNER, **_KEEPALIVES},
            open=False,
            name=f"trioq-{self.schema}",
        )
        try:
            await trio.to_thread.run_sync(self._open_pool, pool)
            self._pool = pool
            await self._call(self._prepare_schema)
            self._leading = await self._call(sql.lead, config.node, config.clock(), self.leader_ttl)
            await self.evict()  # the session's bounds hold from the start
            if config.defer_past is not None:  # room made while no session was open is filled now
                self._admitted(await self._call(_defer.admit, config.defer_past, config.clock(), config.fairness))
            else:  # no bound: jobs an earlier session deferred must not stay so
                self._admitted(await self._call(_defer.admit_all, config.clock()))
            stop = threading.Event()
            send, receive = trio.open_memory_channel[list[str]](math.inf)
            self._fetch = send
            self._notify_wanted = trio.Event()
            async with trio.open_nursery() as nursery:
                await nursery.start(self._listen, stop)
                nursery.start_soon(self._notifier)
                nursery.start_soon(self._lead)
                nursery.start_soon(self._fetch_finished, receive)
                gatherer = self._gatherer = Gatherer(self._add_gathered)
                nursery.start_soon(gatherer.run)
                try:
                    yield
                finally:
                    with trio.CancelScope(shield=True):
                        try:
                            # Adds in flight first: one may claim jobs for this node's workers, and commit
                            # them running after the release below unless it waits for them. (Bounded: an
                            # add blocked on another transaction's key must not hold the close; its jobs
                            # would then be rescued as a dead node's are.)
                            with trio.move_on_after(ADDS_AT_CLOSE):
                                await gatherer.stop()
                            released = await self._call(_release_node, config.node, config.limits, config.fairness)
                            if released:
                                self._pending_ready += released
                                await self._send_notifications()
                            if self._leading:
                                await self._call(sql.resign, config.node)
                        finally:
                            stop.set()
                            with trio.move_on_after(1.0):  # wakes our listener at once (others ignore it)
                                await self._call(_notify, self.channel, [f"s|{config.node}|stop"])
                            nursery.cancel_scope.cancel()
        finally:
            self._config = None
            self._pool = None
            self._fetch = None
            self._gatherer = None
            self._leading = False
            self._lease_until = -math.inf
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(pool.close)

    def _open_pool(self, pool: Any) -> None:
        """Open ``pool``, waiting up to :data:`OPEN_TIMEOUT` for its first connection; past it, raise the
        error a plain connect gives (refused, unknown database, bad password), not the pool's timeout."""
        from psycopg_pool import PoolTimeout

        try:
            pool.open(wait=True, timeout=OPEN_TIMEOUT)
        except PoolTimeout:
            pool.close()
            with self._connect():  # raises the reason
                pass
            raise

    def _prepare_schema(self, conn: Any, schema: str) -> None:
        if self.migrate:
            with conn.cursor() as cur:
                current = current_version(cur, schema) == SCHEMA_VERSION
            if not current:  # (a current schema is read in two statements: no lock, no transaction)
                migrate(conn, schema)
        else:
            with conn.cursor() as cur:
                version = current_version(cur, schema)
            if version != SCHEMA_VERSION:
                raise RuntimeError(
                    f"schema {schema!r} is at version {version}, this trioq needs {SCHEMA_VERSION}; run "
                    f"`trioq pg migrate DSN --schema {schema}` (or open with migrate=True)"
                )
        if self._open().fairness is not None:
            # The index fair claims read, built the first time a session claims fairly (see FAIR_INDEX).
            ensure_fair_index(conn, schema)

    async def _listen(self, stop: threading.Event, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the listener thread; started once it first listens (no hint sent after the session opens is
        missed for want of a listener)."""
        token = trio.lowlevel.current_trio_token()
        first = True

        def listening() -> None:
            nonlocal first
            if first:
                first = False
                task_status.started()
            else:
                self._reconnected()

        try:
            await trio.to_thread.run_sync(
                listen, self._connect, self.channel, token, self._heard, listening, stop,
                limiter=trio.CapacityLimiter(1),
            )  # fmt: skip
        finally:
            stop.set()

    def _heard(self, payloads: list[str]) -> None:
        """Notifications from the listener: the hints of other nodes (our own were given already)."""
        config = self._config
        if config is None:
            return
        me = config.node
        ready = 0
        finished: list[str] = []
        for payload in payloads:
            kind, _, rest = payload.partition("|")
            node, _, rest = rest.partition("|")
            if node == me:
                continue
            try:
                if kind == "r":
                    ready += int(rest)
                elif kind == "c":
                    job_id, _, epoch = rest.rpartition("|")
                    config.on_cancel(job_id, int(epoch))
                elif kind == "f":
                    finished.extend(self._watched_of(rest))
            except ValueError:
                _log.warning("trioq: ignored a malformed notification %r", payload[:200])
        if ready:
            config.on_ready(ready)
        if finished and self._fetch is not None:
            self._fetch.send_nowait(finished)

    def _watched_of(self, ids: str) -> list[str]:
        watched = self._open().watched
        if ids == "*":
            return list(watched) if isinstance(watched, Collection) else []
        return [job_id for job_id in ids.split(",") if job_id in watched]

    def _reconnected(self) -> None:
        """The listener reconnected: notifications may have been lost meanwhile."""
        config = self._config
        if config is None:
            return
        config.on_ready(1)
        if self._fetch is not None:
            self._fetch.send_nowait(self._watched_of("*"))

    async def _fetch_finished(self, receive: trio.MemoryReceiveChannel[list[str]]) -> None:
        """Hand the terminal snapshots of watched jobs another node finished to ``on_finished``."""
        async for ids in receive:
            if not ids:
                continue
            for job in await self._call(sql.watched_terminal, ids):
                self._open().on_finished(job)

    async def _lead(self) -> None:
        config = self._open()
        while True:
            await trio.sleep(self.leader_ttl / 3)
            self._leading = await self._call(sql.lead, config.node, config.clock(), self.leader_ttl)

    def leading(self) -> bool:
        """Whether this node leads now: the runtime runs rescue and eviction only on the leader."""
        return self._leading

    # ------------------------------------------------------------- hints

    def _announce(self, ready: int) -> None:
        """Tell other nodes that ``ready`` jobs may be claimable, soon (coalesced: at most one NOTIFY per
        :data:`NOTIFY_EVERY`). Finished jobs and cancels are announced inside their transitions."""
        self._pending_ready += ready
        if self._notify_wanted is not None:
            self._notify_wanted.set()

    def _inline_notify(self, ready: int) -> tuple[str, str] | None:
        """The NOTIFY an add may send in its own transaction, if none went out within :data:`NOTIFY_EVERY`."""
        now = time.monotonic()
        if self._pending_ready or now - self._last_notify < NOTIFY_EVERY or not ready:
            return None
        self._last_notify = now
        return self.channel, f"r|{self._open().node}|{ready}"

    async def _notifier(self) -> None:
        while True:
            assert self._notify_wanted is not None
            await self._notify_wanted.wait()
            self._notify_wanted = trio.Event()
            wait = self._last_notify + NOTIFY_EVERY - time.monotonic()
            if wait > 0:
                await trio.sleep(wait)
            await self._send_notifications()

    async def _send_notifications(self) -> None:
        node = self._open().node
        payloads: list[str] = []
        if self._pending_ready:
            payloads.append(f"r|{node}|{self._pending_ready}")
            self._pending_ready = 0
        if payloads:
            self._last_notify = time.monotonic()
            await self._call(_notify, self.channel, payloads)

    def _local_finished(self, jobs: Sequence[Job]) -> None:
        config = self._open()
        for job in jobs:
            config.on_finished(job)

    # ------------------------------------------------------ the protocol

    async def add(self, jobs: Sequence[NewJob], *, max_pending: int | None = None) -> Added:
        self._open()
        rows = self._rows(jobs)
        if not rows:
            await trio.lowlevel.checkpoint()
            return Added()
        # A batch with keys is refused whole when one key is another task's: checked in the transaction
        # that inserts it, alone (gathered with other adds, its refusal would undo theirs). A single job's
        # add finds out from the holder it meets, having inserted nothing.
        whole = len(rows) > 1 and any(job.key is not None for _, job, _ in rows)
        if any(job.after for _, job, _ in rows):
            return await self._add_flow(rows, max_pending)
        if max_pending is None and self._gatherer is not None and not whole:
            # Sent with the other adds waiting meanwhile, in one statement.
            answers = await self._gatherer.call(rows)  # a call's rows go in one statement: one now
            found, now = [was for was, _, _ in answers], answers[0][1]
            states: list[str] | None = [state for _, _, state in answers]
        else:
            found, now, states = await self._insert(rows, max_pending, check=_clash_refuser(rows) if whole else None)
        return self._added(rows, found, now, announce=True, states=states)

    async def _insert(
        self,
        rows: list[_Row],
        max_pending: int | None,
        *,
        claim: bool = False,
        check: Callable[[list[Job | None]], object] | None = None,
    ) -> tuple[list[Job | None], float, list[str] | None]:
        """Insert ``rows`` in one statement at the store's now: what :func:`sql.add` found, that now, and
        (``defer_past`` set, or ``claim`` and a row marked) each row's state as inserted (see ``_defer.add``).

        ``claim``: the statement may claim some of the jobs for this node's
        idle workers (:meth:`_claiming`), handed to them here, and ``"running"``
        in their states. ``check``: as :func:`sql.add`'s (not with ``claim``).
        Other nodes hear of the ready jobs inside the statement, or from the
        notifier soon after when a NOTIFY went out within :data:`NOTIFY_EVERY`.
        """
        config = self._open()
        now = config.clock()
        ready = sum(1 for _, job, _ in rows if job.delay <= 0)
        claiming = self._claiming(rows, now) if claim and max_pending is None and config.defer_past is None else None
        # With claiming, the statement sends it only if a job is left ready (its count is then a hint).
        notify = self._inline_notify(ready)
        states: list[str] | None = None
        if claiming is not None:
            named = claiming.queues is not None  # the workers it may claim for, keyed as takers() keys them
            marked = collections.Counter(
                row[1].queue if named else None for row, mark in zip(rows, claiming.rows, strict=True) if mark
            )
            try:
                with self._reserving(marked):
                    found, taken = await self._call(sql.add_claiming, rows, now, notify, claiming, retried=True)
            except BaseException:
                # It may have committed (and claimed) before it failed: a claim looks (claim()), now.
                self._unsure.add(claiming.token)
                config.on_ready(1)
                raise
            running = set(taken)
            states = ["running" if job_id in running else "" for job_id, _, _ in rows]
            inserted = [
                was is None and job.delay <= 0 and job_id not in running
                for was, (job_id, job, _) in zip(found, rows, strict=True)
            ]
            if running:
                # Best first, as a claim gives them; each a snapshot of its own (the payload decoded
                # from what was stored, never the caller's object).
                handed = [_new_job(row, now, _RUNNING, 1, loads(row[2])) for row in rows if row[0] in running]
                handed.sort(key=lambda job: -job.priority)
                config.on_claimed(handed)
        elif config.defer_past is None:
            found = await self._call(sql.add, rows, now, max_pending, notify, retried=True, check=check)
            inserted = [was is None and job.delay <= 0 for was, (_, job, _) in zip(found, rows, strict=True)]
        else:
            found, states, admitted = await self._call(
                _defer.add, rows, now, config.defer_past, max_pending, notify, config.fairness, retried=True,
                check=check,
            )  # fmt: skip
            inserted = [was is None and state == "ready" for was, state in zip(found, states or (), strict=True)]
            self._admitted(admitted)
        if notify is None and any(inserted):  # inserted ready and not claimed: other nodes hear soon
            self._announce(sum(inserted))
        return found, now, states

    async def _add_flow(self, rows: list[_Row], max_pending: int | None) -> Added:
        """:meth:`add` of a batch with parents (``NewJob.after``), in a transaction of its own (``_flows.add``);
        other nodes hear of its ready jobs inside it."""
        config = self._open()
        now = config.clock()
        notify = (self.channel, f"r|{config.node}|")
        self._parents = True
        out, inserted = await self._call(
            _flows.add, rows, now, max_pending, config.defer_past, notify, retried=True, check=_flow_clash_refuser(rows)
        )
        ready = 0
        for job, new in zip(out, inserted, strict=True):
            if not new:
                continue
            if job.state is _READY:
                ready += 1
            elif job.state is _SCHEDULED:
                self._scheduled(job.run_at)
            if job.deadline is not None and not job.state.terminal:
                self._deadlines_used = True
                self._scheduled(job.deadline)  # the timer promotes then, which cancels the job if it has not started
        if ready:
            config.on_ready(ready)
        return _found(rows, out, [i for i, new in enumerate(inserted) if not new])

    async def _add_gathered(self, rows: list[_Row]) -> list[tuple[Job | None, float, str]]:
        """The :class:`Gatherer`'s statement: ``rows`` of several adds at once, each with the one ``now``; it
        may claim some for this node's idle workers (a statement beside a stalled one claims only for the
        workers that one did not reserve: :meth:`_reserving`)."""
        found, now, states = await self._insert(rows, None, claim=True)
        if states is None:
            return [(was, now, "") for was in found]
        return [(was, now, state) for was, state in zip(found, states, strict=True)]

    def _admitted(self, admitted: _defer.Admitted) -> None:
        """Deferred jobs an admission made ready or scheduled: this node's workers and timer hear, and
        (soon) the other nodes."""
        if admitted.ready:
            self._open().on_ready(admitted.ready)
            self._announce(admitted.ready)
        for run_at in admitted.scheduled:
            self._scheduled(run_at)

    def add_tx(self, conn: Any, jobs: Sequence[NewJob], now: float) -> list[Job]:
        """:meth:`add` inside the caller's transaction on the psycopg connection ``conn`` (sync).

        The jobs and their NOTIFY become visible when the caller commits, and
        never if it rolls back. No ``max_ready`` bound: the caller's
        transaction decides. Callable from any thread. Jobs with parents
        (``after``) lock their parents' rows until the caller commits: a
        parent's completion waits for that commit (keep such transactions short).
        """
        config = self._open()
        rows = self._rows(jobs)
        # As add: a batch is refused whole on a key clash, undone to a savepoint in the caller's transaction.
        whole = len(rows) > 1 and any(job.key is not None for _, job, _ in rows)
        check = _clash_refuser(rows) if whole else None
        if any(job.after for _, job, _ in rows):  # parents: locked in the caller's transaction (see _flows)
            self._parents = True  # a plain flag: any thread
            out, inserted = _flows.add(
                conn, self.schema, rows, now, None, config.defer_past, (self.channel, "r||"),
                check=_flow_clash_refuser(rows),
            )  # fmt: skip
            if any(job.deadline is not None for _, job, _ in rows):
                self._deadlines_used = True
            # A key's holder of another task is refused here as in add (a single job's insert found it,
            # having inserted nothing).
            return _found(rows, out, [i for i, new in enumerate(inserted) if not new])
        ready = sum(1 for _, job, _ in rows if job.delay <= 0)
        # Node "": every node hears it, this one included (it commits later, out of our sight).
        notify = (self.channel, f"r||{ready}") if ready else None
        states: list[str] | None = None
        if config.defer_past is None:
            found = sql.add(conn, self.schema, rows, now, None, notify, check=check)
        else:
            # Deferred past the bound as an enqueue is, counted in the caller's snapshot; it admits nothing
            # (that would hold the admission lock until the caller commits).
            found, states, _ = _defer.add(
                conn, self.schema, rows, now, config.defer_past, None, notify, config.fairness, admit_first=False,
                check=check,
            )  # fmt: skip
        if any(job.deadline is not None for _, job, _ in rows):
            self._deadlines_used = True  # claims look for due deadlines from now on (a plain flag: any thread)
        return self._added(rows, found, now, announce=False, states=states)

    def _rows(self, jobs: Sequence[NewJob]) -> list[_Row]:
        rows = []
        for i, job in enumerate(jobs):
            where = "" if len(jobs) == 1 else f"jobs[{i}]."
            checked = _checked(job, where)  # queue, tenant and deadline too
            rows.append((self._ids(), checked, encode_payload(checked.payload, f"{where}payload")))
        return rows

    def _added(
        self,
        rows: list[_Row],
        found: list[Job | None],
        now: float,
        *,
        announce: bool,
        states: Sequence[str] | None = None,
    ) -> Added:
        config = self._config
        out: list[Job] = []
        held: list[int] = []
        ready = 0
        for i, (row, existing) in enumerate(zip(rows, found, strict=True)):
            job = row[1]
            if existing is not None:
                out.append(existing)
                held.append(i)
                continue
            run_at = now + job.delay
            epoch = 0
            if states is not None and states[i] == "deferred":
                state = _DEFERRED
            elif states is not None and states[i] == "running":
                state, epoch = _RUNNING, 1  # claimed by the add for this node's workers (see _insert)
            else:
                state = _SCHEDULED if run_at > now else _READY
            deadline = None if job.deadline is None else now + job.deadline
            out.append(_new_job(row, now, state, epoch, job.payload))
            if state is _READY:
                ready += 1
            elif announce and config is not None and state is _SCHEDULED:
                self._scheduled(run_at)
            if deadline is not None and announce and config is not None:
                self._deadlines_used = True
                self._scheduled(deadline)  # the timer promotes then, which cancels the job if it has not started
        if announce and config is not None and ready:
            config.on_ready(ready)
        return _found(rows, out, held)

    async def claim(self, request: ClaimRequest) -> list[Job]:
        config = self._open()
        limit = request.limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"ClaimRequest.limit must be an int >= 0, got {limit!r}")
        queues = self._queues_of(request.queues)
        if limit == 0 or queues == []:
            await trio.lowlevel.checkpoint()
            return []
        now = config.clock()
        lease_until = None
        if self._lease_until < now + request.lease / 2:
            lease_until = now + request.lease
        self._claims += 1
        token = f"{self._claims}"
        tries = 0
        promote = now >= self._due
        walk = queues is None and bool(self._paused_known)
        probe = self._deadlines_used
        promoted: tuple[sql.Promoted, list[Job], _defer.Admitted] | None = None
        late: list[Job] = []
        channel, me, watched = self.channel, config.node, config.watched
        fair, defer = config.fairness, config.defer_past
        admitted = _defer.Admitted()
        clock = _thread_clock(config.clock)
        found: dict[str, Any] = {}

        def claim_jobs(conn: Any, schema: str) -> sql.Claimed:
            nonlocal late
            claimed = sql.claim(
                conn, schema, request.node, limit, lease_until, token, tries > 1,
                now=now, queues=queues, walk=walk, probe=probe, limit_of=config.limits, fair=fair, clock=clock,
            )  # fmt: skip
            if claimed.next_deadline is not None and claimed.next_deadline <= now:
                # Deadlines this node had not heard of (another node's jobs) have come: the claim left those
                # jobs, and they are cancelled now rather than at the next promote.
                late = _expire(conn, schema, now, channel, me, watched, config.limits, config.fairness)
            return claimed

        unsure = self._unsure  # this claim's to look for (no other claim serves them)
        if unsure:
            self._unsure = set()
        recovered: list[Job] = []

        def claim(conn: Any, schema: str) -> sql.Claimed:
            nonlocal tries, promoted, walk, probe, admitted, recovered
            tries += 1
            # Jobs a failed add may have claimed for this node: served with this claim's.
            recovered = [job for token in unsure for job in sql.claimed_with(conn, schema, request.node, token)]
            if promote and tries == 1:  # due run_at or deadlines this node knows of: before picking
                promoted = _promote(conn, schema, now, channel, me, watched, config.limits, defer, fair)
                walk = queues is None and bool(promoted[0].paused)
                probe = promoted[0].next_deadline is not None
            # The room the claim makes is filled in its own transaction.
            claimed, admitted = _defer.admitting(conn, schema, defer, now, fair, lambda: claim_jobs(conn, schema))
            parents = sorted({p for job in claimed for p in job.after})
            if parents:  # ctx.parents, read in this call: the children start without another hop
                found.update(_flows.results(conn, schema, parents))
            return claimed

        claim.__name__ = "claim"
        try:
            claimed = await self._call(claim)
        except BaseException:
            self._unsure |= unsure
            raise
        if recovered:  # to the pools serving their queues, as the add would have handed them
            config.on_claimed(recovered)
        if found:
            self._parent_results.keep(claimed, found)
        if promoted is not None:
            self._promoted(*promoted)
        if late:
            self._local_finished(late)
        if admitted:
            self._admitted(admitted)
        if claimed.next_deadline is not None:
            self._deadlines_used = True
            if claimed.next_deadline > now:
                self._due = min(self._due, claimed.next_deadline)
        if lease_until is not None:
            self._lease_until = max(self._lease_until, lease_until)
        if claimed.next_unpark is not None:
            self._scheduled(claimed.next_unpark)  # a job passed over for a rate: promote when its token is due
        if claimed.more:
            config.on_ready(1)  # the claim stopped short of its limit with jobs left: claim again
        return claimed

    def _queues_of(self, queues: Collection[str] | None) -> list[str] | None:
        """The distinct names of ``queues`` that a job can have, sorted (``None``: every queue). A name no
        job can have (empty, too long, not UTF-8) matches nothing. The answer for the last tuple is kept:
        a node asks for the same queues every time."""
        if queues is None:
            return None
        last, names = self._claim_queues
        if type(queues) is tuple and (queues is last or queues == last):
            return names
        if isinstance(queues, str):
            raise TypeError(f"ClaimRequest.queues must be a tuple of queue names, not a str: {queues!r:.80}")
        names = sorted({str.__str__(q) for q in queues if label_problem(q) is None})
        if type(queues) is tuple:
            self._claim_queues = (queues, names)
        return names

    async def extend(self, node: str, held: Sequence[tuple[str, int]], lease: float) -> list[bool]:
        config = self._open()
        usable = [(str(job_id), int(epoch)) for job_id, epoch in held if _usable_id(job_id) and _usable_epoch(epoch)]
        answered: list[bool] = []
        if usable or node == config.node:  # the node's own with none held: its heartbeat, the row alone
            answered, until = await self._call(sql.extend, node, usable, lease, _thread_clock(config.clock))
            if node == config.node:
                # Only a statement that ran renewed the node's row (a claim that believed it had must
                # still write the row, else rescue takes its jobs at once).
                self._lease_until = max(self._lease_until, until)
        answers = iter(answered)
        return [next(answers) if _usable_id(job_id) and _usable_epoch(epoch) else False for job_id, epoch in held]

    async def complete(self, outcomes: Sequence[Outcome]) -> list[JobState | None]:
        config = self._open()
        if not outcomes:
            await trio.lowlevel.checkpoint()
            return []
        now = config.clock()
        # One pass: which outcomes can name a row (the others are stale by construction).
        named: list[bool] = []
        for o in outcomes:
            if not isinstance(o, _OUTCOMES):
                raise TypeError(f"not a trioq.stores outcome: {type(o).__name__}")
            named.append(_usable_id(o.job_id) and _usable_epoch(o.epoch))
        usable = [o for o, ok in zip(outcomes, named, strict=True) if ok]
        take = self._take(now) if self._parents else None
        handed: set[tuple[str, int]] = set()

        def hand_over(settled: _flows.Settled) -> None:
            """Children claimed for this node as their parents succeeded (in trio, from the call's thread,
            before it goes on to the limit keys' unpark): to the workers, each once."""
            jobs = [job for job in settled.claimed if (job.id, job.epoch) not in handed]
            handed.update((job.id, job.epoch) for job in jobs)
            if jobs:
                self._parent_results.keep(jobs, settled.results)
                config.on_claimed(jobs)

        with self._reserving({} if take is None else dict(zip(take.queues or (None,), take.counts, strict=True))):
            states, snapshots, scheduled, unparked, settled = await self._call(
                _complete, usable, now, self.channel, config.node, config.watched, config.limits, config.fairness,
                self._parents, take, _early(hand_over) if take is not None else None, retried=True,
            )  # fmt: skip
        if settled.parents:
            self._parents = True  # flows are in use: successes release children in their own statement
        hand_over(settled)  # (the call handed them over already, unless a retry found more)
        answers = iter(states)
        out = [next(answers) if ok else None for ok in named]
        ready = sum(1 for state in out if state is _READY) + unparked
        for run_at in (*scheduled, *settled.scheduled):
            self._scheduled(run_at)
        if ready:
            config.on_ready(ready)
            self._announce(ready)
        if settled.ready:  # children whose last parent succeeded: the other nodes heard in the transaction
            config.on_ready(settled.ready)
        self._local_finished(snapshots)
        return out

    def _take(self, now: float) -> _handoff.Take | None:
        """What a success may claim of the children it releases, for this node's idle workers
        (``StoreConfig.takers``); ``None`` with fair claims (their order is the fair claim's to decide), or
        while the node's lease is not known to last (a claim renews it first)."""
        config = self._open()
        if config.fairness is not None or self._lease_until < now + self.lease / 2:
            return None
        reserved = self._reserved
        wanted = {queue: n - reserved.get(queue, 0) for queue, n in config.takers().items()}
        wanted = {queue: n for queue, n in wanted.items() if n > 0}
        if not wanted:
            return None
        self._claims += 1
        keyed = config.limits is not no_limits
        if None in wanted:  # one pool serves every queue
            return _handoff.Take(None, (wanted[None],), f"{self._claims}", keyed)
        queues = sorted(q for q in wanted if q is not None)
        return _handoff.Take(tuple(queues), tuple(wanted[q] for q in queues), f"{self._claims}", keyed)

    @contextmanager
    def _reserving(self, counts: Mapping[str | None, int]) -> Iterator[None]:
        """While the block runs (a statement in flight), the idle workers it may claim for, by queue as
        ``takers()`` keys them, are not offered to another (:meth:`_take`)."""
        reserved = self._reserved
        for queue, n in counts.items():
            reserved[queue] = reserved.get(queue, 0) + n
        try:
            yield
        finally:
            for queue, n in counts.items():
                reserved[queue] -= n
                if not reserved[queue]:
                    del reserved[queue]

    def _claiming(self, rows: list[_Row], now: float) -> sql.Claiming | None:
        """What an add of ``rows`` may claim for this node's idle workers (see :func:`sql.add_claiming`):
        as :meth:`_take` allows, the rows a claim would take, best first (priority, then the order
        given), at most the idle workers of each queue served; ``None`` when none (or too many rows for
        the statement that can claim). A row of a queue paused unbeknown to this node (another node
        paused it) may take a mark the statement then refuses: that job waits for an ordinary claim."""
        if len(rows) >= sql.COPY_FROM or now >= self._due:
            return None  # (a due job this node knows of is promoted by its next claim, and may rank first)
        take = self._take(now)  # (None, cheaply, while no worker waits: a busy node's every enqueue)
        if take is None:
            return None
        if take.keyed and any(job.limits and job.delay <= 0 for _, job, _ in rows):
            return None  # a keyed job goes through the limit path's claim, and may rank first
        room = dict(zip(take.queues or (None,), take.counts, strict=True))
        marks = [False] * len(rows)
        for i in sorted(range(len(rows)), key=lambda i: -rows[i][1].priority):
            job = rows[i][1]
            served: str | None = None if take.queues is None else job.queue
            if job.delay > 0 or job.queue in self._paused_known or room.get(served, 0) <= 0:
                continue
            if job.deadline is not None and job.deadline <= 0:
                continue  # its deadline has come: a claim leaves it to be cancelled
            room[served] -= 1
            marks[i] = True
        if not any(marks):
            return None
        return sql.Claiming(self._open().node, take.token, tuple(marks), take.queues)

    async def rescue(self) -> int:
        config = self._open()
        rescued, unparked = await self._call(_rescue, config.clock(), config.limits, config.fairness)
        if rescued + unparked:
            config.on_ready(rescued + unparked)
            self._announce(rescued + unparked)
        return rescued

    async def sync(self, job_id: str | None = None) -> None:
        self._open()
        await trio.lowlevel.checkpoint()  # every transition is committed before it returns

    async def get(self, job_id: str) -> Job:
        self._open()
        if not _usable_id(job_id):
            await trio.lowlevel.checkpoint()
            raise JobNotFound(f"no job with id {job_id!r:.80} (never enqueued, or evicted after retention)")
        return await self._call(sql.get, job_id)

    async def cancel(self, job_id: str) -> CancelResult:
        config = self._open()
        if not _usable_id(job_id):
            await trio.lowlevel.checkpoint()
            raise JobNotFound(f"no job with id {job_id!r:.80} (never enqueued, or evicted after retention)")
        result, running, unparked, admitted, cascaded = await self._call(
            _cancel, job_id, config.clock(), self.channel, config.node, config.limits, config.defer_past,
            config.fairness, config.watched, retried=True,
        )  # fmt: skip
        if admitted:
            self._admitted(admitted)
        if running is not None:
            config.on_cancel(job_id, running)
        if unparked:
            config.on_ready(unparked)
            self._announce(unparked)
        if result.changed and job_id in config.watched:
            config.on_finished(result.job)
        self._local_finished(cascaded)
        return result

    async def retry(self, job_id: str) -> Job:
        config = self._open()
        if not _usable_id(job_id):
            await trio.lowlevel.checkpoint()
            raise JobNotFound(f"no job with id {job_id!r:.80} (never enqueued, or evicted after retention)")
        job = await self._call(sql.retry, job_id, config.clock(), (self.channel, f"r|{config.node}|1"), retried=True)
        if job.state is _READY:  # a job with parents still to succeed waits for them instead
            config.on_ready(1)
        return job

    async def promote(self) -> float | None:
        config = self._open()
        done = await self._call(
            _promote, config.clock(), self.channel, config.node, config.watched, config.limits, config.defer_past,
            config.fairness,
        )  # fmt: skip
        self._promoted(*done)
        return done[0].next_due

    def _promoted(self, done: sql.Promoted, finished: list[Job], admitted: _defer.Admitted | None = None) -> None:
        """What a promote did, told: ready jobs to this node's workers and (soon) the others', the
        terminal snapshots of watched jobs it cancelled for their deadline; what it read of the next
        due time and the pauses is kept."""
        due = done.next_due
        self._due = math.inf if due is None else due
        self._paused_known = set(done.paused)
        self._deadlines_used = done.next_deadline is not None
        ready = done.promoted + done.unparked
        if ready:
            self._open().on_ready(ready)
            self._announce(ready)
        if admitted:
            self._admitted(admitted)
        self._local_finished(finished)

    def _scheduled(self, at: float) -> None:
        """A job of this node's is due at ``at`` (its run_at, or its deadline): the timer, and a claim past
        it, promote then."""
        self._due = min(self._due, at)
        self._open().on_scheduled(at)

    async def evict(self) -> int:
        """Drop finished jobs past retention (see ``_transitions.evict``); and at most once per
        :data:`_RATE_SWEEP_EVERY` seconds, the rate states that have run out (``_admin.sweep_rates``)."""
        config = self._open()
        now = config.clock()
        evicted = await self._call(sql.evict, now - config.retention, config.max_retained)
        if now >= self._next_rate_sweep:
            self._next_rate_sweep = now + _RATE_SWEEP_EVERY
            await self._call(_admin.sweep_rates, now - _RATE_SWEEP_MARGIN)
        return evicted

    async def counts(self) -> dict[str, int]:
        self._open()
        return await self._call(sql.counts)

    async def pause(self, queue: str) -> bool:
        """Pause ``queue`` for every node (a row every claim reads); whether it was running. Running
        attempts finish; a name no job could have but that is a valid name (one nobody used yet) is paused
        all the same. :class:`~trioq.InvalidJob` (``field="queue"``) for a name :func:`label_problem`
        refuses."""
        config = self._open()
        name = label("queue", queue)
        was_running = await self._call(sql.pause, name, config.clock(), retried=True)
        self._paused_known.add(name)
        return was_running

    async def resume(self, queue: str) -> bool:
        """Let every node claim ``queue``'s jobs again; whether it was paused. Wakes this node's workers
        (``on_ready``) and, by a notification in the same statement, every other node's."""
        config = self._open()
        name = label("queue", queue)
        wake = await self._call(sql.resume, name, self.channel, config.node)
        self._paused_known.discard(name)
        if wake is None:
            return False
        if config.limits is not no_limits:
            # Jobs of the queue parked on keys were not let go while it was paused (unpark skips them).
            unparked = await self._call(_limits.repair, config.limits, config.fairness)
            if unparked:
                self._announce(unparked)
            wake += unparked
        config.on_ready(wake)
        return True

    async def paused(self) -> list[str]:
        self._open()
        names = await self._call(sql.paused)
        self._paused_known = set(names)
        return names

    async def limit_usage(self) -> dict[str, tuple[int, int, float | None]]:
        """Each limit key in use across every node: ``(holders, jobs parked for a slot, rate tat or
        None)`` (see :func:`._admin.limit_usage`)."""
        self._open()
        return await self._call(_admin.limit_usage)

    async def nodes(self) -> list[dict[str, Any]]:
        """The nodes sharing this store, by id: ``[{"id", "expires_at"}]``, ``expires_at`` the end of
        each one's lease on the runtime's clock (wall time); one small query (see :func:`._admin.nodes`).
        For the dashboard: not part of the Store protocol, which other stores do without."""
        self._open()
        return [{"id": node, "expires_at": until} for node, until in await self._call(_admin.nodes)]

    async def has_pending(self) -> bool:
        """Whether any job is ready, scheduled, running, deferred or waiting (what ``join()`` asks; cheaper
        than :meth:`counts`)."""
        self._open()
        return await self._call(sql.has_pending)

    async def results(self, ids: Sequence[str]) -> dict[str, Any]:
        """The ``result`` of each of ``ids`` that this store holds and that succeeded, in one query (for
        ``ctx.parents``): ``{id: result}``, ``None`` for a job that returned nothing. An id it does not hold
        (never added, evicted, or not a possible id), or whose job has not succeeded, is left out."""
        self._open()
        wanted = sorted({job_id for job_id in ids if _usable_id(job_id)})
        kept = self._parent_results.take(wanted) if wanted and self._parent_results else None
        if kept is not None or not wanted:  # read with the claim of the job asking (see ParentResults)
            await trio.lowlevel.checkpoint()
            return kept or {}
        return await self._call(_flows.results, wanted)

    async def jobs(self, states: Collection[JobState], *, limit: int = 100) -> list[Job]:
        self._open()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        return await self._call(sql.jobs, list(states), limit)

    async def list_jobs(self, where: JobFilter, *, limit: int, after_id: str | None = None) -> list[Job]:
        """See :meth:`Store.list_jobs <trioq.stores.Store.list_jobs>`: from the index ``jobs_listing``
        (``_listing``)."""
        self._open()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        if after_id is not None and not _usable_id(after_id):  # no row holds it (psycopg would refuse it)
            await trio.lowlevel.checkpoint()
            raise _listing.unknown_after(after_id)
        return await self._call(_listing.list_jobs, where, limit, after_id)

    async def add_tick(self, name: str, tick: float, job: NewJob | None) -> Job | None:
        """See :meth:`Store.add_tick <trioq.stores.Store.add_tick>`: the tick's row and its job in one
        transaction (``_cron``), so nodes racing for a tick, or a leader change, enqueue it once."""
        if job is None:
            await _cron.baseline(self, name, tick)
            return None
        return await _cron.add_tick(self, name, tick, job)

    async def ticks(self) -> dict[str, float]:
        """Each cron schedule's last tick (or baseline), by name."""
        return await _cron.ticks(self)


def _new_job(row: _Row, now: float, state: JobState, epoch: int, payload: Any) -> Job:
    """The snapshot of ``row`` as an add at ``now`` left it: in ``state``, under ``epoch`` (1: claimed),
    holding ``payload`` (the caller's object for the caller's snapshot, a decoded copy for a worker)."""
    job_id, job, _ = row
    deadline = None if job.deadline is None else now + job.deadline
    return Job(job_id, job.task, payload, state, 0, epoch, job.priority, job.key, job.max_attempts,
               now + job.delay, now, None, None, None, (), job.queue, job.tenant, deadline, job.limits)  # fmt: skip


def _where(rows: Sequence[_Row], i: int) -> str:
    return "" if len(rows) == 1 else f"jobs[{i}]."


def _found(rows: Sequence[_Row], jobs: list[Job], held: list[int]) -> Added:
    """``jobs`` as :meth:`PostgresStore.add` answers them, ``held`` the indexes whose key found a holder;
    :func:`key_clash` if a holder is a job of another task."""
    holders: list[Job | None] = [None] * len(rows)
    for i in held:
        holders[i] = jobs[i]
    _refuse_clash(rows, holders)
    return Added(jobs, held)


def _refuse_clash(rows: Sequence[_Row], holders: Sequence[Job | None]) -> None:
    """Raise :func:`key_clash` for the first of ``rows`` whose key's holder (``holders[i]``, ``None``: it
    went in) is a job of another task: one earlier in the batch, or one in the table."""
    for i, holder in enumerate(holders):
        job = rows[i][1]
        if holder is not None and holder.task != job.task:
            raise key_clash(job.key or "", holder.task, job.task, _where(rows, i))


def _clash_refuser(rows: Sequence[_Row]) -> Callable[[list[Job | None]], None]:
    """An add's ``check`` that refuses the whole batch ``rows`` on a key clash (:func:`_refuse_clash`)."""
    return functools.partial(_refuse_clash, rows)


def _flow_clash_refuser(rows: Sequence[_Row]) -> Callable[[list[Job], list[bool]], None]:
    """:func:`_clash_refuser` for ``_flows.add``'s answer (each row's snapshot, whether it went in)."""

    def check(jobs: list[Job], inserted: list[bool]) -> None:
        _refuse_clash(rows, [None if new else job for job, new in zip(jobs, inserted, strict=True)])

    return check


def _notify(conn: Any, schema: str, channel: str, payloads: list[str]) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT " + ", ".join("pg_notify(%s, %s)" for _ in payloads),
            [value for payload in payloads for value in (channel, payload)],
        )


def _complete(
    conn: Any,
    schema: str,
    outcomes: Sequence[Outcome],
    now: float,
    channel: str,
    node: str,
    watched: Any,
    limit_of: Callable[[str], Limit | None],
    fair: Mapping[str, float] | None = None,
    parents: bool = False,
    take: _handoff.Take | None = None,
    early: Callable[[_flows.Settled], None] | None = None,
    *,
    retried: bool = False,
) -> tuple[list[JobState | None], list[Job], list[float], int, _flows.Settled]:
    """``complete`` in one worker thread: the outcomes applied (``parents``, ``take``: as ``sql.complete``'s),
    then the snapshots of the watched jobs that finished (read at once: only the leader's eviction may drop
    them; children a parent's end cancelled among them); the run times of jobs scheduled; how many jobs
    parked on the limit keys of the attempts that ended were let go; and what the parents' ends did to
    their children (with the children claimed, and their parents' results).

    ``early(settled)`` is called as soon as children were claimed (they are committed), before the limit
    keys are unparked: a child need not wait for that. A try after a broken connection finds the
    children its first try claimed, if that try committed."""
    freed: set[str] = set()
    settled = _flows.Settled()
    states, finished, scheduled = sql.complete(
        conn, schema, outcomes, now, channel, node, retried=retried, freed=freed, settled=settled, parents=parents,
        take=take,
    )  # fmt: skip
    if retried and take is not None:
        settled.claimed = sql.claimed_with(conn, schema, node, take.token)
        parent_ids = sorted({p for job in settled.claimed for p in job.after})
        settled.results = _flows.results(conn, schema, parent_ids) if parent_ids else {}
    if settled.claimed and early is not None:
        early(settled)
    unparked = _limits.unpark(conn, schema, freed, limit_of, fair)
    wanted = [job_id for job_id in finished if job_id in watched]
    snapshots = sql.watched_terminal(conn, schema, wanted) if wanted else []
    return states, snapshots, scheduled, unparked, settled


def _early(hand_over: Callable[[_flows.Settled], None]) -> Callable[[_flows.Settled], None]:
    """``hand_over``, called from a worker thread of this trio run (``_complete``'s ``early``)."""

    def early(settled: _flows.Settled) -> None:
        trio.from_thread.run_sync(hand_over, settled)

    return early


def _cancel(
    conn: Any,
    schema: str,
    job_id: str,
    now: float,
    channel: str,
    node: str,
    limit_of: Callable[[str], Limit | None],
    defer: int | None = None,
    fair: Mapping[str, float] | None = None,
    watched: Any = (),
    *,
    retried: bool = False,
) -> tuple[CancelResult, int | None, int, _defer.Admitted, list[Job]]:
    """``cancel`` in one worker thread, and the unparking of the jobs waiting on the keys of the attempt it
    stopped (how many); with ``defer``, the admission of deferred jobs into the room it made, in its own
    transaction; last, the snapshots of the watched jobs cancelled with it (a parent's children)."""
    freed: set[str] = set()
    settled = _flows.Settled()
    (result, running), admitted = _defer.admitting(
        conn, schema, defer, now, fair,
        lambda: sql.cancel(conn, schema, job_id, now, channel, node, retried=retried, freed=freed, settled=settled),
    )  # fmt: skip
    unparked = _limits.unpark(conn, schema, freed, limit_of, fair)
    return result, running, unparked, admitted, _watched_snapshots(conn, schema, settled.cancelled, watched)


def _rescue(
    conn: Any, schema: str, now: float, limit_of: Callable[[str], Limit | None], fair: Mapping[str, float] | None = None
) -> tuple[int, int]:
    """``rescue`` in one worker thread: ``(jobs rescued, jobs parked on a key that were let go)``; the
    unparking owed for every key jobs wait on is checked too (:func:`_limits.repair`: a node that died
    between an outcome and its unpark)."""
    freed: set[str] = set()
    rescued = sql.rescue(conn, schema, now, freed=freed)
    unparked = _limits.unpark(conn, schema, freed, limit_of, fair)
    return rescued, unparked + _limits.repair(conn, schema, limit_of, fair)


def _release_node(
    conn: Any, schema: str, node: str, limit_of: Callable[[str], Limit | None], fair: Mapping[str, float] | None = None
) -> int:
    """``release_node`` in one worker thread: the jobs released plus those parked on their keys let go."""
    freed: set[str] = set()
    released = sql.release_node(conn, schema, node, freed=freed)
    return released + _limits.unpark(conn, schema, freed, limit_of, fair)


def _promote(
    conn: Any,
    schema: str,
    now: float,
    channel: str,
    node: str,
    watched: Any,
    limit_of: Callable[[str], Limit | None],
    defer: int | None = None,
    fair: Mapping[str, float] | None = None,
) -> tuple[sql.Promoted, list[Job], _defer.Admitted]:
    """``promote`` in one worker thread, and the terminal snapshots of the watched jobs it cancelled for
    their deadline (read at once, as ``_complete`` does); the keys of the jobs it cancelled unparked (one
    may have been let go for a slot it never took). With ``defer`` (``defer_past``), deferred jobs are
    admitted into the room, in the same transaction as the expiry that made it (and whatever room
    concurrency left)."""
    freed: set[str] = set()
    settled = _flows.Settled()
    done, admitted = _defer.admitting(
        conn, schema, defer, now, fair,
        lambda: sql.promote(conn, schema, now, channel, node, freed=freed, settled=settled),
    )  # fmt: skip
    if unparked := _limits.unpark(conn, schema, freed, limit_of, fair):
        done = attrs.evolve(done, unparked=done.unparked + unparked)
    return done, _watched_snapshots(conn, schema, [*done.expired, *settled.cancelled], watched), admitted


def _expire(
    conn: Any,
    schema: str,
    now: float,
    channel: str,
    node: str,
    watched: Any,
    limit_of: Callable[[str], Limit | None],
    fair: Mapping[str, float] | None = None,
) -> list[Job]:
    """``expire`` in one worker thread: the terminal snapshots of the watched jobs it cancelled (their keys
    unparked, as in :func:`_promote`)."""
    freed: set[str] = set()
    settled = _flows.Settled()
    expired = sql.expire(conn, schema, now, channel, node, freed=freed, settled=settled)
    _limits.unpark(conn, schema, freed, limit_of, fair)
    return _watched_snapshots(conn, schema, [*expired, *settled.cancelled], watched)


def _watched_snapshots(conn: Any, schema: str, ids: Sequence[str], watched: Any) -> list[Job]:
    wanted = [job_id for job_id in ids if job_id in watched]
    return sql.watched_terminal(conn, schema, wanted) if wanted else []
