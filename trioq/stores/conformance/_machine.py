"""The model-based run: hypothesis drives a store through the protocol, step by step, against the reference.

Hypothesis's stateful testing is synchronous and the store is async, so the
run happens inside one trio run: the state machine runs in a worker thread
(``trio.to_thread.run_sync``) and makes each store call with
``trio.from_thread.run``, which runs it in the trio thread. A session is an
async context manager that must be entered and left in one task: each lives
in a task of its own (:class:`_Sessions`), opened and closed on request.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import attrs
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ..._model import InvalidJob, Job, JobNotFound, JobState, QueueFull, TrioqError
from .._base import ClaimRequest, Failed, Outcome, Released, Snoozed, Store, StoreConfig, Succeeded
from ._harness import NODE, Harness, StoreKind
from ._reference import Reference

__all__ = ["run_model"]

T = TypeVar("T")

#: The nodes of a store that serves concurrent sessions (one-session stores use the first).
NODES = (NODE, "node-b", "node-c")
#: The lease of every claim: longer than any run's clock moves, so no lease lapses and ``rescue`` finds nothing.
LEASE = 1e6
_EVERY_STATE = tuple(JobState)


@attrs.frozen
class _Plan:
    """What an outcome of the run will be: its kind and its arguments."""

    kind: type[Outcome]
    #: A result (``Succeeded``), and whether a store can hold it.
    result: Any = None
    storable: bool = True
    #: ``retry_in`` (``Failed``) or ``delay`` (``Snoozed``).
    delay: float | None = None
    traceback: bool = False


_PLANS = (
    _Plan(Succeeded, None),
    _Plan(Succeeded, {"ok": [1, "x"]}),
    _Plan(Succeeded, 2**64, storable=False),
    _Plan(Succeeded, float("nan"), storable=False),
    *(_Plan(Failed, delay=d, traceback=tb) for d in (0.0, 5.0, 30.0, None) for tb in (False, True)),
    _Plan(Released),
    *(_Plan(Snoozed, delay=d) for d in (0.0, 5.0, 30.0)),
)
_NODE = st.integers(0, len(NODES) - 1)
_SPEC = st.tuples(
    st.sampled_from([0.0, 0.0, 1.0, 10.0, 60.0]),  # delay
    st.sampled_from([None, None, "k1", "k2"]),  # key
    st.sampled_from([0, 0, 1, -1]),  # priority
    st.sampled_from([1, 2, 3, 8]),  # max_attempts
)


@attrs.define
class _Held:
    """One open session, held by its own task until :meth:`_Sessions.close`."""

    release: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    error: Exception | None = None


class _Sessions:
    """The trio side of the run: keeps each session open in a task of ``nursery``."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    async def open(self, store: Store, config: StoreConfig) -> _Held:
        """Open a session of ``store``; its error, if it cannot open, is raised here."""
        held: _Held = await self._nursery.start(self._hold, store, config)
        return held

    async def close(self, held: _Held) -> None:
        """Close the session of ``held``; its error, if closing failed, is raised here."""
        held.release.set()
        await held.done.wait()
        if held.error is not None:
            raise held.error

    async def _hold(self, store: Store, config: StoreConfig, *, task_status: trio.TaskStatus[_Held]) -> None:
        held = _Held()
        entered = False
        try:
            async with store.session(config):
                entered = True
                task_status.started(held)
                await held.release.wait()
        except Exception as exc:
            if not entered:
                raise  # nursery.start raises it to the opener
            held.error = exc
        finally:
            held.done.set()


async def _everything(store: Store) -> tuple[list[Job], dict[str, int]]:
    return await store.jobs(_EVERY_STATE, limit=1_000_000), await store.counts()


@attrs.frozen
class _Run:
    """What every example of one run shares."""

    kind: StoreKind
    path: Path
    sessions: _Sessions


class StoreMachine(RuleBasedStateMachine):
    """Drives one store (two nodes of it, where it serves concurrent sessions) against :class:`Reference`."""

    jobs: Bundle[str] = Bundle("jobs")
    #: ``(job_id, epoch, node)`` of every claim made, current or long stale.
    claims: Bundle[tuple[str, int, str]] = Bundle("claims")

    #: Set by :func:`run_model` on the subclass it runs.
    run_context: ClassVar[_Run]

    def __init__(self) -> None:
        super().__init__()
        run = self.run_context
        self.sessions = run.sessions
        self.harness = Harness(run.kind, Path(tempfile.mkdtemp(prefix="example-", dir=run.path)))
        self.nodes = NODES[: run.kind.nodes] if run.kind.concurrent_sessions else NODES[:1]
        self.stores: dict[str, Store] = {}
        self.held: dict[str, _Held] = {}
        self.model = Reference(retention=3600.0, max_retained=100_000)
        self.overrides: dict[str, Any] = {}
        self.opened = False
        self.cancel_hints: list[tuple[str, int]] = []
        self.made = 0

    # ------------------------------------------------------------ plumbing

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in the trio thread and return what it returns."""
        return trio.from_thread.run(functools.partial(fn, *args, **kwargs))

    def node(self, index: int) -> str:
        return self.nodes[index % len(self.nodes)]

    def store(self, index: int = 0) -> Store:
        return self.stores[self.node(index)]

    def config(self, node: str) -> StoreConfig:
        return self.harness.config(node=node, **self.overrides)

    def open(self, node: str, store: Store) -> None:
        """Open a session of ``node`` on ``store``, and promote what is due, as the runtime does.

        A durable store need not log promotions (being due is a matter of the
        clock): after a replay, a job made ready by ``promote`` may be
        scheduled again, due, until the next ``promote`` or claim.
        """
        now = self.harness.clock.now
        self.held[node] = self.call(self.sessions.open, store, self.config(node))
        self.stores[node] = store
        self.model.open_session(now)
        assert self.call(store.promote) == self.model.promote(now)

    def close(self, node: str) -> None:
        held = self.held.pop(node)
        self.call(self.sessions.close, held)
        self.model.end_session(node)

    def agree(self, problems: list[str]) -> None:
        assert not problems, "the store differs from the model:\n" + "\n".join(problems)

    @property
    def inline_cancels(self) -> bool:
        """Whether ``on_cancel`` must come exactly, inline: one node of a store with inline hints."""
        return self.harness.kind.inline_hints and len(self.nodes) == 1

    def outcome(self, job_id: str, epoch: int, plan: _Plan) -> Outcome:
        """The outcome ``plan`` describes, for the attempt of ``job_id`` under ``epoch``."""
        if plan.kind is Succeeded:
            return Succeeded(job_id, epoch, plan.result)
        if plan.kind is Failed:
            self.made += 1
            traceback = f"Traceback {self.made}" if plan.traceback else None
            return Failed(job_id, epoch, f"E: {self.made}", plan.delay, traceback)
        if plan.kind is Released:
            return Released(job_id, epoch)
        assert plan.delay is not None
        return Snoozed(job_id, epoch, plan.delay)

    def add_jobs(
        self,
        specs: list[tuple[float, str | None, int, int]],
        max_pending: int | None,
        parents: Sequence[Sequence[str | int]] = (),
    ) -> list[str]:
        """Add a job for each spec, the ``i``-th waiting for ``parents[i]`` (``QueueFull`` or, for a
        parent the store does not hold, ``InvalidJob`` expected where the model says so); the ids answered."""
        new = []
        for i, (delay, key, priority, max_attempts) in enumerate(specs):
            self.made += 1
            payload = {"n": self.made}
            after = parents[i] if i < len(parents) else ()
            new.append(
                self.harness.job(
                    payload=payload, delay=delay, key=key, priority=priority, max_attempts=max_attempts, after=after
                )
            )
        if self.model.unknown_parent(new):
            try:
                self.call(self.store().add, new, max_pending=max_pending)
            except InvalidJob as exc:
                assert exc.field is not None and exc.field.endswith("after"), f"add raised {exc!r}"
                return []
            raise AssertionError(f"add naming a parent the store does not hold was accepted: {new}")
        if self.model.would_refuse(new, max_pending):
            try:
                self.call(self.store().add, new, max_pending=max_pending)
            except QueueFull:
                return []
            raise AssertionError(f"add past max_pending={max_pending} was accepted")
        answered = self.call(self.store().add, new, max_pending=max_pending)
        self.agree(self.model.add(new, answered, self.harness.clock.now))
        return [job.id for job in answered]

    def complete_all(self, node: int, attempts: list[tuple[str, int]], plans: list[_Plan]) -> None:
        """Complete each attempt with its plan in one call, as the model says it must answer."""
        now = self.harness.clock.now
        outcomes: list[Outcome] = []
        expected = []
        for (job_id, epoch), plan in zip(attempts, plans, strict=True):
            outcome = self.outcome(job_id, epoch, plan)
            outcomes.append(outcome)
            expected.append(self.model.complete(outcome, now, storable=plan.storable))
        answered = self.call(self.store(node).complete, outcomes)
        assert answered == expected, f"complete({outcomes}) answered {answered}, expected {expected}"

    # --------------------------------------------------------------- rules

    @initialize(
        target=jobs,
        retention=st.sampled_from([30.0, 3600.0]),
        max_retained=st.sampled_from([1, 3, 100_000]),
        specs=st.lists(_SPEC, max_size=6),
    )
    def open_sessions(
        self, retention: float, max_retained: int, specs: list[tuple[float, str | None, int, int]]
    ) -> MultipleResults[str]:
        """Open the sessions (one per node) with the example's retention bounds, and add a first batch."""
        self.model = Reference(
            retention=retention, max_retained=max_retained, bound_at_evict=self.harness.kind.bound_at_evict
        )
        self.overrides = {"retention": retention, "max_retained": max_retained}
        first = self.harness.make()
        for node in self.nodes:
            self.open(node, first if node == self.nodes[0] else self.harness.reopen(first))
        self.opened = True
        return multiple(*self.add_jobs(specs, None))

    @rule(target=jobs, specs=st.lists(_SPEC, min_size=1, max_size=4), max_pending=st.sampled_from([None, 3, 8]))
    def add(self, specs: list[tuple[float, str | None, int, int]], max_pending: int | None) -> MultipleResults[str]:
        return multiple(*self.add_jobs(specs, max_pending))

    @precondition(lambda self: self.model.max_retained > 1000)  # see Reference._finish
    @rule(
        target=jobs,
        named=st.lists(jobs, min_size=1, max_size=2),
        specs=st.lists(st.tuples(_SPEC, st.lists(st.integers(0, 2), max_size=2)), min_size=1, max_size=3),
        max_pending=st.sampled_from([None, 3]),
    )
    def add_flow(
        self,
        named: list[str],
        specs: list[tuple[tuple[float, str | None, int, int], list[int]]],
        max_pending: int | None,
    ) -> MultipleResults[str]:
        """Add jobs with parents: each waits for the ``named`` jobs (any state, evicted ones too), and
        each after the first for the job before it and the earlier jobs of the batch its indexes name."""
        parents: list[list[str | int]] = [
            [*named, *dict.fromkeys(k for k in (i - 1, *indexes) if 0 <= k < i)] for i, (_, indexes) in enumerate(specs)
        ]
        return multiple(*self.add_jobs([spec for spec, _ in specs], max_pending, parents))

    @rule(target=claims, limit=st.integers(0, 4), node=_NODE)
    def claim(self, limit: int, node: int) -> MultipleResults[tuple[str, int, str]]:
        """Claim, keeping the attempts for later outcomes and extends."""
        name = self.node(node)
        answered = self.call(self.stores[name].claim, ClaimRequest(name, limit, LEASE))
        self.agree(self.model.claim(name, answered, limit))
        return multiple(*((job.id, job.epoch, name) for job in answered))

    @rule(target=claims, plans=st.lists(st.sampled_from(_PLANS), min_size=1, max_size=4), node=_NODE)
    def work(self, plans: list[_Plan], node: int) -> MultipleResults[tuple[str, int, str]]:
        """Claim a job per plan and complete what was claimed at once, the way a worker does."""
        name = self.node(node)
        answered = self.call(self.stores[name].claim, ClaimRequest(name, len(plans), LEASE))
        self.agree(self.model.claim(name, answered, len(plans)))
        self.complete_all(node, [(job.id, job.epoch) for job in answered], plans[: len(answered)])
        return multiple(*((job.id, job.epoch, name) for job in answered))

    @rule(picks=st.lists(st.tuples(claims, st.sampled_from(_PLANS)), min_size=1, max_size=4), node=_NODE)
    def complete(self, picks: list[tuple[tuple[str, int, str], _Plan]], node: int) -> None:
        """Complete attempts claimed earlier: current ones, and stale ones that must be refused."""
        self.complete_all(node, [(job_id, epoch) for (job_id, epoch, _), _ in picks], [plan for _, plan in picks])

    @rule(picks=st.lists(claims, min_size=1, max_size=4), node=_NODE)
    def extend(self, picks: list[tuple[str, int, str]], node: int) -> None:
        """Extend a node's attempts: ``True`` exactly for those whose epoch still holds the job."""
        name = self.node(node)
        held = [(job_id, epoch) for job_id, epoch, owner in picks if owner == name]
        answered = self.call(self.stores[name].extend, name, held, LEASE)
        expected = [self.model.holds(job_id, epoch) for job_id, epoch in held]
        assert answered == expected, f"extend({held}) answered {answered}, expected {expected}"

    @rule(job=jobs, node=_NODE)
    def cancel(self, job: str, node: int) -> None:
        """Cancel any job: changed unless terminal; a running one's attempt hears of it."""
        model = self.model.jobs.get(job)
        if model is None:
            self.not_found(self.store(node).cancel, job)
            return
        changed, running = self.model.cancel(job, self.harness.clock.now)
        answered = self.call(self.store(node).cancel, job)
        assert answered.changed is changed, f"cancel({job}).changed is {answered.changed}, expected {changed}"
        self.agree(model.problems(answered.job))
        if running is not None:
            self.cancel_hints.append((job, running))
        if self.inline_cancels:
            assert self.harness.hints.cancelled == self.cancel_hints, "on_cancel hints differ"

    @rule(job=jobs, node=_NODE)
    def retry(self, job: str, node: int) -> None:
        """Retry any job: a dead or cancelled one goes back to ready, any other is refused."""
        model = self.model.jobs.get(job)
        if model is None:
            self.not_found(self.store(node).retry, job)
            return
        refused = self.model.retry(job, self.harness.clock.now)
        if refused is None:
            self.agree(model.problems(self.call(self.store(node).retry, job)))
            return
        try:
            self.call(self.store(node).retry, job)
        except InvalidJob as exc:
            assert exc.field == refused, f"retry of a {model.state.value} job raised {exc!r}, not for {refused!r}"
        else:
            raise AssertionError(f"retry of a {model.state.value} job was accepted (refused for {refused!r})")

    @rule(seconds=st.sampled_from([1.0, 10.0, 61.0]), evict=st.booleans(), node=_NODE)
    def advance(self, seconds: float, evict: bool, node: int) -> None:
        """Move the clock on, then promote what came due and, with ``evict``, evict (the runtime's timers)."""
        now = self.harness.clock.advance(seconds)
        assert self.call(self.store(node).promote) == self.model.promote(now)
        if evict:
            assert self.call(self.store(node).evict) == self.model.evict(now)

    @rule(
        op=st.sampled_from(["promote", "evict", "rescue", "sync", "jobs"]),
        states=st.sets(st.sampled_from(_EVERY_STATE), min_size=1),
        limit=st.integers(1, 5),
        node=_NODE,
    )
    def housekeeping(self, op: str, states: set[JobState], limit: int, node: int) -> None:
        """One of the calls that change no attempt: promote, evict, rescue, sync, or a listing."""
        store, now = self.store(node), self.harness.clock.now
        if op == "promote":
            assert self.call(store.promote) == self.model.promote(now)
        elif op == "evict":
            assert self.call(store.evict) == self.model.evict(now)
        elif op == "rescue":
            rescued = self.call(store.rescue)
            assert type(rescued) is int and rescued == 0, f"rescue() answered {rescued!r} while every lease holds"
        elif op == "sync":
            self.call(store.sync)
        else:
            answered = [job.id for job in self.call(store.jobs, states, limit=limit)]
            assert answered == self.model.listed(states, limit), f"jobs({sorted(states)}, limit={limit}) differs"

    @rule(job=jobs, node=_NODE)
    def get(self, job: str, node: int) -> None:
        """A snapshot of any job, ``JobNotFound`` once dropped; and a sync for it."""
        model = self.model.jobs.get(job)
        if model is None:
            self.not_found(self.store(node).get, job)
        else:
            self.agree(model.problems(self.call(self.store(node).get, job)))
        self.call(self.store(node).sync, job)

    @rule(node=_NODE, second=st.booleans())
    def reopen(self, node: int, second: bool) -> None:
        """Close a node's session (its running jobs go back to ready) and open a new one over the same data.

        With ``second``, a store that serves one session is first asked for a
        second one, which it must refuse, saying why.
        """
        name = self.node(node)
        store = self.stores[name]
        if second and not self.harness.kind.concurrent_sessions:
            self.second_session_is_refused(store)
        self.close(name)
        self.open(name, self.harness.reopen(store))

    def second_session_is_refused(self, store: Store) -> None:
        other = self.harness.reopen(store)
        try:
            held = self.call(self.sessions.open, other, self.config(NODE))
        except (RuntimeError, TrioqError) as exc:
            assert str(exc).strip(), "the refusal of a second session should say why"
        else:
            self.call(self.sessions.close, held)
            raise AssertionError("a second session of a one-session store was opened")

    @precondition(lambda self: self.opened)
    @invariant()
    def agrees_with_the_model(self) -> None:
        """Every job the store holds, and its counts, are the model's."""
        snapshots, counts = self.call(_everything, self.store())
        self.agree(self.model.problems(snapshots, counts))

    def not_found(self, fn: Callable[[str], Awaitable[object]], job: str) -> None:
        try:
            self.call(fn, job)
        except JobNotFound:
            return
        raise AssertionError(f"{getattr(fn, '__name__', fn)}({job!r}) of a dropped job did not raise JobNotFound")

    def teardown(self) -> None:
        try:
            for node in list(self.held):
                self.close(node)
        finally:
            shutil.rmtree(self.harness.path, ignore_errors=True)


async def run_model(kind: StoreKind, path: Path, *, max_examples: int, steps: int) -> None:
    """Run :class:`StoreMachine` over ``kind`` for ``max_examples`` examples of up to ``steps`` steps.

    Each example's store keeps its data in a fresh directory under ``path``.
    Call it inside a trio run; a failure is raised here, hypothesis's account
    of the steps that led to it printed before.
    """
    run_settings = settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        run = _Run(kind, path, _Sessions(nursery))

        class Machine(StoreMachine):
            """The machine over this run's kind."""

        Machine.run_context = run

        def drive() -> Exception | None:
            try:
                run_state_machine_as_test(Machine, settings=run_settings)
            except Exception as exc:
                return exc
            return None

        try:
            failure = await trio.to_thread.run_sync(drive)
        finally:
            nursery.cancel_scope.cancel()  # sessions a failed example left open
    if failure is not None:
        raise failure
