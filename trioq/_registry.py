"""Task registration: which functions handle which job names, and how; cron schedules of jobs."""

from __future__ import annotations

import datetime
import inspect
import types
import typing
import zoneinfo
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import attrs
import msgspec
import trio
from croniter import CroniterError, croniter  # type: ignore[import-untyped]

from . import _validate as validate
from ._model import (
    DEFAULT_QUEUE,
    INT64_MAX,
    Adaptive,
    Backoff,
    InvalidJob,
    Limit,
    UnknownTask,
    check_json,
    label_problem,
    name_problem,
)
from .policies.limits import LimitBook, check_templates

__all__ = ["CronSpec", "Registry", "TaskDef", "TaskKind", "tick_key"]

TaskKind = Literal["async", "thread", "process"]
_KINDS = ("async", "thread", "process")
F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen
class TaskDef:
    """One registered task: its handler and the defaults its jobs get."""

    name: str
    fn: Callable[..., Any]
    kind: TaskKind = "async"
    max_attempts: int = 5
    backoff: Backoff = Backoff()
    timeout: float | None = None
    heartbeat_timeout: float | None = None
    priority: int = 0
    #: Exception types that fail a job for good (dead at once, no retry).
    no_retry: tuple[type[BaseException], ...] = ()
    #: The named queue its jobs wait in unless their enqueue names another.
    queue: str = DEFAULT_QUEUE
    #: Templates of the limit keys its jobs hold (``"user:{user_id}"``), filled at enqueue.
    limits: tuple[str, ...] = ()
    # From the handler's signature, for checking payloads at enqueue time.
    params: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    takes_any: bool = True
    #: The payload fields whose annotation is a plain JSON type, and the types a value may have.
    types: Mapping[str, tuple[type, ...]] = attrs.field(factory=dict)

    def heartbeat_timeout_in(self, queue_heartbeat_timeout: float | None) -> float | None:
        """The heartbeat timeout its attempts get: its own, else the queue's, else none.

        With no ``timeout`` either, nothing bounds an attempt (see ``Attempt``).
        """
        return self.heartbeat_timeout if self.heartbeat_timeout is not None else queue_heartbeat_timeout

    def check_payload(self, payload: dict[str, Any], where: str = "") -> None:
        """Raise :class:`InvalidJob` unless ``handler(ctx, **payload)`` would bind.

        ``where`` prefixes the message and the field (``"jobs[3]."`` in a batch).
        """
        if not self.takes_any:
            unknown = payload.keys() - self.params
            if unknown:
                raise InvalidJob(
                    f"{where}task {self.name!r} takes no argument(s) {sorted(unknown)}; it takes {sorted(self.params)}",
                    field=f"{where}payload",
                )
        missing = self.required - payload.keys()
        if missing:
            raise InvalidJob(
                f"{where}task {self.name!r} needs payload field(s) {sorted(missing)}", field=f"{where}payload"
            )
        for name, allowed in self.types.items():
            if name in payload:
                value = payload[name]
                if not isinstance(value, allowed) or (type(value) is bool and bool not in allowed):
                    wanted = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
                    raise InvalidJob(
                        f"{where}task {self.name!r}: payload field {name!r} must be {wanted} (the handler's"
                        f" annotation), got {type(value).__name__} {_shown(value)}",
                        field=f"{where}payload",
                    )


def _shown(value: Any) -> str:
    """``value``'s repr, cut to 40 characters (an int too long to print as digits shows as ``<int>``)."""
    try:
        return f"{value!r:.40}"
    except ValueError:
        return f"<{type(value).__name__}>"


#: What a value from JSON may be for each plain annotation (a float field takes an int: JSON's 3 is 3.0).
_PLAIN: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
    list: (list,),
    dict: (dict,),
}


def _plain_types(fn: Callable[..., Any], names: frozenset[str]) -> dict[str, tuple[type, ...]]:
    """The payload fields of ``fn`` annotated with a plain JSON type (``int``, ``float``, ``str``, ``bool``,
    ``list``/``list[...]``, ``dict``/``dict[...]``, or a union of them with ``None``), and the types each
    takes. Other annotations (``Any``, classes, ``Literal``...) are not checked, nor any when the
    annotations cannot be evaluated where the function was defined."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # whatever evaluating them raises (a type checker never evaluates them)
        return {}  # a forward reference or a name only a type checker sees: left to the handler
    found: dict[str, tuple[type, ...]] = {}
    for name in names:
        hint = hints.get(name)
        parts = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        allowed: list[type] = []
        for part in parts:
            part = typing.get_origin(part) or part
            if part is type(None):
                allowed.append(type(None))
            elif part in _PLAIN:
                allowed += [t for t in _PLAIN[part] if t not in allowed]
            else:
                break
        else:
            if allowed:
                found[name] = tuple(allowed)
    return found


def _describe(fn: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str], bool]:
    """Payload names the handler accepts, those it requires, and whether it takes ``**kw``."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise TypeError(f"task handler {fn.__qualname__} must take the job context as its first argument")
    names: set[str] = set()
    required: set[str] = set()
    takes_any = False
    for p in params[1:]:
        if p.kind is p.VAR_KEYWORD:
            takes_any = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.add(p.name)
            if p.default is p.empty:
                required.add(p.name)
        elif p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise TypeError(
                f"task handler {fn.__qualname__}: payload fields are passed by name; {p.name!r} is positional-only"
            )
    return frozenset(names), frozenset(required), takes_any


def tick_key(name: str, tick: float) -> str:
    """The idempotency key of the job of cron schedule ``name``'s tick at wall time ``tick``:
    ``"cron:<name>:<tick as UTC ISO 8601, to the second>"``, e.g. ``"cron:noop:2026-01-01T00:05:00Z"``."""
    at = datetime.datetime.fromtimestamp(tick, datetime.UTC)
    return f"cron:{name}:{at.strftime('%Y-%m-%dT%H:%M:%SZ')}"


@attrs.frozen
class CronSpec:
    """One cron schedule of a registry (see :meth:`Registry.cron`): a job of ``task`` with
    ``payload`` at every tick of ``schedule`` (croniter syntax) in the time zone ``tz``.

    ``name`` identifies the schedule in the store (its last tick is recorded under it). Times are
    wall-clock seconds since the epoch, as a :class:`~trioq.Job`'s ``run_at`` is.
    """

    schedule: str
    task: str
    payload: dict[str, Any]
    name: str
    tz: str = "UTC"

    def _iter(self, at: float) -> Any:
        return croniter(self.schedule, datetime.datetime.fromtimestamp(at, zoneinfo.ZoneInfo(self.tz)))

    def next_tick(self, after: float) -> float:
        """The schedule's first tick strictly after wall time ``after``."""
        return float(self._iter(after).get_next(float))

    def last_tick(self, at: float) -> float:
        """The schedule's latest tick at or before wall time ``at`` (``at`` itself when it is a tick)."""
        ticks = self._iter(at)
        ticks.get_next(float)  # the first tick after at; the one before it is at or before at
        return float(ticks.get_prev(float))


def _cron_spec(schedule: object, task: object, payload: object, name: object, tz: object) -> CronSpec:
    """:meth:`Registry.cron`'s arguments checked, as a :class:`CronSpec`; else ``ValueError`` (``TypeError``
    for a schedule, task or tz that is not a string)."""
    if not isinstance(schedule, str):
        raise TypeError(f"a cron schedule must be a string such as '*/5 * * * *', got {type(schedule).__name__}")
    if not isinstance(task, str) or not task:
        raise TypeError(f"cron task must be a task name (a non-empty string), got {task!r:.60}")
    if not isinstance(tz, str):
        raise TypeError(f"tz must be the name of a time zone (such as 'UTC' or 'Europe/Paris'), got {tz!r:.60}")
    try:
        zone = zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"tz {tz!r:.60} is no time zone zoneinfo knows; use an IANA name such as 'UTC' or 'Europe/Paris'"
        ) from None
    shown = f"cron schedule {schedule!r:.80}"
    if len(schedule.split()) > 6:  # croniter reads a year there: such a schedule runs out of ticks
        raise ValueError(
            f"{shown} has a seventh field (year), which trioq does not take: a schedule must tick forever "
            "(five fields, an optional sixth of seconds); enqueue a one-off job with delay=... instead"
        )
    try:
        valid = croniter.is_valid(schedule)
        if valid:  # a valid expression may still never fire (February 30th): find its next tick
            croniter(schedule, datetime.datetime.now(zone)).get_next(float)
    except (CroniterError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{shown} never fires: {exc}") from None
    if not valid:
        raise ValueError(
            f"{shown} is not valid cron syntax: five fields (minute hour day-of-month month day-of-week), "
            "as in '*/5 * * * *' or '0 3 * * mon', an optional sixth of seconds, or an alias such as '@hourly'"
        )
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise ValueError(f"cron payload must be a dict (or None), got {type(payload).__name__}")
    try:
        check_json(payload, what="payload")
        # A copy the caller cannot change behind the schedule's back; fails as a store would.
        copied: dict[str, Any] = msgspec.msgpack.decode(msgspec.msgpack.encode(payload))
    except (InvalidJob, TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"cron payload for task {task!r:.60} cannot be stored: {exc}") from None
    cron_name = task if name is None else name
    problem = label_problem(cron_name)
    if problem is not None:
        source = f"the default name (the task's, {task!r:.60})" if name is None else f"cron name {name!r:.60}"
        raise ValueError(f"{source} cannot name a schedule: {problem}; pass name=... (a short label)")
    assert isinstance(cron_name, str)
    return CronSpec(schedule=schedule, task=task, payload=copied, name=str.__str__(cron_name), tz=tz)


class Registry:
    """A set of task handlers, keyed by name.

    Use :meth:`task` as a decorator, bare or with options::

        registry = trioq.Registry()

        @registry.task
        async def noop(ctx): ...

        @registry.task(name="email.send", max_attempts=3, timeout=30.0)
        async def send(ctx, to: str) -> dict: ...

    ``kind="async"`` handlers run in the worker task; ``kind="thread"`` handlers
    are plain functions run in a worker thread; ``kind="process"`` handlers are
    plain module-level functions run in a worker process (killed when their
    attempt's deadline passes).
    """

    def __init__(self) -> None:
        self._tasks: dict[str, TaskDef] = {}
        #: The limits declared with :meth:`limit`.
        self.limits = LimitBook()
        self._crons: dict[str, CronSpec] = {}

    def limit(
        self,
        key: str,
        *,
        max: int | Adaptive | None = None,
        rate: float | None = None,
        per: float = 1.0,
        burst: int | None = None,
    ) -> Limit:
        """Declare a limit on the jobs holding ``key`` (a key ending in ``*`` is a pattern: each key it
        matches has a limit of its own, so ``limit("user:*", max=1)`` is a mutex per user).

        ``max``: at most that many attempts hold the key at once. ``rate`` per
        ``per`` seconds, with ``burst`` (default 1) at once: in any window of
        ``w`` seconds at most ``burst + rate * w / per`` attempts start under
        it. A job is claimed only when every key it holds allows it; jobs
        blocked by a limit are passed over, not waited for. On a shared store
        the limit holds across every node, so every node must declare the
        same limits. ``max=trioq.Adaptive(min, max)``: the cap moves between
        ``min`` and ``max`` from the latency and failures of the attempts
        holding the key on this node (each key of a pattern its own; see
        docs/policies.md, "Adaptive caps"). Raises ``ValueError``
        (``TypeError`` for a ``max`` that is not an int or an ``Adaptive``)
        for a bad or duplicate declaration.
        """
        return self.limits.declare(key, max=max, rate=rate, per=per, burst=burst)

    def cron(
        self,
        schedule: str,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        tz: str = "UTC",
    ) -> CronSpec:
        """Enqueue a job of ``task`` with ``payload`` at every tick of the cron ``schedule``, once per
        store however many nodes run (``registry.cron("*/5 * * * *", "noop", payload={})``).

        ``schedule``: croniter syntax, five fields (minute, hour, day of month, month, day of
        week), an optional sixth of seconds (last: ``"* * * * * */10"`` is every 10 s), or an
        alias such as ``"@hourly"``; read in the time zone ``tz`` (an IANA name, ``"UTC"`` by
        default; daylight saving time as croniter handles it, see ``docs/cron.md``). ``name``
        identifies the schedule in the store, which records the last tick enqueued under it; it
        defaults to the task's name, so a second schedule of one task needs a ``name`` of its
        own (``ValueError`` otherwise), and renaming a schedule starts it afresh. The task need
        not be registered yet: :func:`~trioq.open_queue` refuses a registry whose crons name a
        task it does not know, or whose payload the task does not take.

        Ticks are enqueued by the queue that leads the store (any in-process store's queue; on
        PostgreSQL, the leader node), each job with idempotency key
        ``"cron:<name>:<tick, UTC ISO 8601>"``. The first session of a store that knows a
        schedule records the time it opened as a baseline: the first job is for the first tick
        after it, never for ticks before. After downtime (no queue open, or the store out of
        reach), the latest tick missed runs once, not once per missed tick.

        Raises ``ValueError`` for a schedule that is not valid, never fires, or has a seventh
        field (croniter's year: its ticks would run out), an unknown time zone, a payload that
        is not a JSON dict a store can hold, a name that is not a label
        (:func:`~trioq._model.label_problem`), or a name taken by another schedule; and
        ``TypeError`` for a schedule, task or tz that is not a string. Returns the schedule.
        """
        spec = _cron_spec(schedule, task, payload, name, tz)
        if spec.name in self._crons:
            taken = self._crons[spec.name]
            hint = (
                f"pass name=... to tell a second schedule of task {task!r} from the first"
                if name is None
                else "give each schedule its own name"
            )
            raise ValueError(
                f"a cron schedule named {spec.name!r} is already declared ({taken.schedule!r} for task "
                f"{taken.task!r}); {hint}"
            )
        self._crons[spec.name] = spec
        return spec

    @property
    def crons(self) -> tuple[CronSpec, ...]:
        """The cron schedules declared with :meth:`cron`, by name."""
        return tuple(self._crons[name] for name in sorted(self._crons))

    def check_crons(self) -> None:
        """Raise ``ValueError`` naming the schedule if a cron's task is not registered, or its payload
        does not bind to the task's handler (``open_queue`` calls this before it opens the store)."""
        for spec in self.crons:
            definition = self._tasks.get(spec.task)
            if definition is None:
                known = ", ".join(sorted(self._tasks)) or "none"
                raise ValueError(
                    f"cron schedule {spec.name!r} ({spec.schedule!r}) enqueues task {spec.task!r}, which this "
                    f"registry does not know (known: {known}); register the task, or fix the cron's task name"
                )
            try:
                definition.check_payload(spec.payload)
            except InvalidJob as exc:
                raise ValueError(f"cron schedule {spec.name!r}: its payload does not fit: {exc}") from None

    @overload
    def task(self, fn: F, /) -> F: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        kind: TaskKind = "async",
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        priority: int = 0,
        no_retry: type[BaseException] | tuple[type[BaseException], ...] = (),
        queue: str = DEFAULT_QUEUE,
        limits: Sequence[str] = (),
    ) -> Callable[[F], F]: ...

    def task(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        kind: TaskKind = "async",
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        priority: int = 0,
        no_retry: type[BaseException] | tuple[type[BaseException], ...] = (),
        queue: str = DEFAULT_QUEUE,
        limits: Sequence[str] = (),
    ) -> F | Callable[[F], F]:
        """Register a handler; the job name defaults to the function's ``__name__``.

        ``no_retry``: exception types (one, or a tuple) after which the job is
        not tried again: an attempt whose handler raises one (or a subclass,
        or a group holding only such) goes ``dead`` at once, as with
        ``raise trioq.NoRetry(...)``; the attempt counts. ``queue``: the
        named queue its jobs wait in (``"default"``); an enqueue may name
        another. ``limits``: templates of the limit keys its jobs hold while
        they run, filled from the payload and the tenant at enqueue
        (``["gateway", "user:{user_id}"]``); each key must match a limit
        declared with :meth:`limit` by then. Raises
        ``ValueError`` for a duplicate name or a bad option, and
        ``TypeError`` when the function does not fit its ``kind`` or
        ``no_retry`` holds something that is not an exception type.
        """

        def register(func: F) -> F:
            self.add(
                func,
                name=name,
                kind=kind,
                max_attempts=max_attempts,
                backoff=backoff,
                timeout=timeout,
                heartbeat_timeout=heartbeat_timeout,
                priority=priority,
                no_retry=no_retry,
                queue=queue,
                limits=limits,
            )
            return func

        if fn is not None:
            return register(fn)
        return register

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        kind: TaskKind = "async",
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        priority: int = 0,
        no_retry: type[BaseException] | tuple[type[BaseException], ...] = (),
        queue: str = DEFAULT_QUEUE,
        limits: Sequence[str] = (),
    ) -> TaskDef:
        """Register ``fn`` (the non-decorator form of :meth:`task`); returns its definition."""
        task_name = fn.__name__ if name is None else name
        if not isinstance(task_name, str) or not task_name:
            raise ValueError(f"task name must be a non-empty string, got {task_name!r}")
        problem = name_problem(task_name)
        if problem is not None:
            raise ValueError(f"task name {task_name[:60]!r} cannot be stored: {problem}")
        if task_name in self._tasks:
            raise ValueError(f"a task named {task_name!r} is already registered; pass name=... to register another")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        is_async = inspect.iscoroutinefunction(fn)
        if kind == "async" and not is_async:
            raise TypeError(f"{fn.__qualname__} is not an async function; register it with kind='thread' or 'process'")
        if kind != "async" and is_async:
            raise TypeError(f"{fn.__qualname__} is an async function; kind={kind!r} needs a plain function")
        if kind == "process" and ("<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>"):
            raise TypeError(f"{fn.__qualname__}: process handlers must be module-level functions (they are pickled)")
        validate.integer("max_attempts", max_attempts, minimum=1, maximum=INT64_MAX, error=ValueError)
        validate.integer("priority", priority, maximum=INT64_MAX, error=ValueError)
        validate.optional_number("timeout", timeout, above=True, infinite=True, error=ValueError)
        validate.optional_number("heartbeat_timeout", heartbeat_timeout, above=True, infinite=True, error=ValueError)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(f"backoff must be a trioq.Backoff, got {backoff!r}")
        queue = validate.label("queue", queue, error=ValueError)
        templates = check_templates(limits)
        no_retry_types = validate.exception_types("no_retry", no_retry)
        for t in no_retry_types:
            if issubclass(t, BaseExceptionGroup | trio.Cancelled):
                # Matched against the exceptions a group holds, and a Cancelled is never a failure.
                raise TypeError(f"no_retry cannot hold {t.__qualname__}: name the exception types a handler raises")
        params, required, takes_any = _describe(fn)
        definition = TaskDef(
            name=task_name,
            fn=fn,
            kind=kind,
            max_attempts=max_attempts,
            backoff=backoff if backoff is not None else Backoff(),
            timeout=timeout,
            heartbeat_timeout=heartbeat_timeout,
            priority=priority,
            no_retry=no_retry_types,
            queue=queue,
            limits=templates,
            params=params,
            required=required,
            takes_any=takes_any,
            types=_plain_types(fn, params),
        )
        self._tasks[task_name] = definition
        return definition

    def include(self, other: Registry) -> None:
        """Add every task, limit and cron schedule of ``other``; a name or key in both raises ``ValueError``
        (nothing added)."""
        clash = self._tasks.keys() & other._tasks.keys()
        if clash:
            raise ValueError(f"task name(s) {sorted(clash)} are registered in both registries")
        crons = self._crons.keys() & other._crons.keys()
        if crons:
            raise ValueError(f"cron schedule(s) {sorted(crons)} are declared in both registries; name them apart")
        twice = {limit.key for limit in self.limits} & {limit.key for limit in other.limits}
        if twice:
            raise ValueError(f"limit(s) {sorted(twice)} are declared in both registries")
        self.limits.include(other.limits)
        self._tasks.update(other._tasks)
        self._crons.update(other._crons)

    def __getitem__(self, name: str) -> TaskDef:
        try:
            return self._tasks[name]
        except KeyError:
            raise self.unknown(name) from None

    def get(self, name: str) -> TaskDef | None:
        """The task named ``name``, or ``None``."""
        return self._tasks.get(name)

    def unknown(self, name: str) -> UnknownTask:
        """The error for a task name this registry does not know."""
        known = ", ".join(sorted(self._tasks)) or "none"
        shown = repr(name) if len(name) <= 80 else repr(name[:77]) + "..."
        return UnknownTask(f"no task named {shown} is registered (known: {known})")

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)
