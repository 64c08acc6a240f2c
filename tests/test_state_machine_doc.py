"""docs/state_machine.md's transitions table is what ``JobTable`` does, row by row.

The table in the doc is parsed strictly (a malformed row fails the test) and
every row is driven through a real :class:`~trioq.stores.table.jobs.JobTable`:
the job is put in each "from" state, the method is called, and the job's new
state, epoch and attempts are compared with the row's "to", "epoch" and
"attempts". A state a method does not list as "from" must be refused by it.
Every public transition method must have a row, so a new transition cannot go
undocumented.

A row's condition (the text after "when" in its method cell) names a scenario
below: how to set the job up and call the method so that the condition holds.
A row whose condition has no scenario, or a scenario no row uses, fails the test.
"""

from __future__ import annotations

import functools
import heapq
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import attrs
import msgspec
import pytest

from trioq import InvalidJob, Job, JobState
from trioq._model import MAX_ERRORS_KEPT, MAX_SNOOZES, FailedAttempt
from trioq.stores import _base
from trioq.stores.table.jobs import Entry, JobTable

DOC = Path(__file__).resolve().parent.parent / "docs" / "state_machine.md"
HEADER = "| method | from | to | epoch | attempts | notes |"
SEPARATOR = "|---|---|---|---|---|---|"
STATES = {state.value: state for state in JobState}
TERMINAL = tuple(state for state in JobState if state.terminal)

Change = Literal["same", "+1", "0"]
CHANGES: dict[str, Change] = {"—": "same", "+1": "+1", "0": "0"}

#: Public methods of JobTable that are not transitions: queries, and recovery's
#: rebuild of a table from a checkpoint (``clear``, ``restore``). A new public
#: method must be added here or documented as a transition.
NOT_TRANSITIONS = frozenset(
    {
        "by_key", "count", "counts", "entries", "entry", "export", "get", "needs_clock", "holds",
        "holds_key", "jobs", "logged", "next_run_at", "next_deadline", "next_due", "pending", "running",
        "list_jobs", "unfinished_by_queue",  # views for listings and the dashboard
        "peek",  # promotes due jobs (as promote does), then only looks
        "clear", "restore", "restored",
        # A queue's pause is no job's transition: claims skip its jobs, which stay as they are.
        "pause", "resume", "paused", "ready_in",
        # The order claims take among ready jobs, not a move of any job.
        "set_fairness",
    }
)  # fmt: skip

# ------------------------------------------------------------------ parsing

_CALL = r"`(\w+)\(([^`]*)\)`"
_METHOD_CELL = re.compile(rf"^(?P<calls>{_CALL}(?: / {_CALL})*)(?: when (?P<condition>\S.*))?$")
_TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    """One parsed row of the transitions table."""

    line: int
    calls: tuple[tuple[str, str], ...]  # (method, its arguments as written)
    condition: str  # "" when the row has none
    sources: tuple[JobState, ...]  # () for a job that does not exist yet ("—")
    target: JobState | None  # None: the job is gone
    epoch: Change
    attempts: Change

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(method for method, _ in self.calls)


def _fail(line: int, why: str, text: str) -> AssertionError:
    return AssertionError(f"docs/state_machine.md line {line}: {why}: {text!r}")


def _sources(line: int, cell: str) -> tuple[JobState, ...]:
    if cell == "—":
        return ()
    names = _TICKED.findall(cell)
    if not cell.startswith("`") or not names or any(name not in STATES for name in names):
        raise _fail(line, "'from' must be '—' or backticked states (then plain words)", cell)
    if len(set(names)) != len(names):
        raise _fail(line, "'from' repeats a state", cell)
    return tuple(STATES[name] for name in names)


def _target(line: int, cell: str) -> JobState | None:
    states = [name for name in _TICKED.findall(cell) if name in STATES]
    if cell == "gone":
        return None
    match = re.match(r"`(\w+)`", cell)
    if match is None or match.group(1) not in STATES or len(states) != 1:
        raise _fail(line, "'to' must be 'gone' or one backticked state", cell)
    return STATES[match.group(1)]


def _change(line: int, cell: str) -> Change:
    if cell not in CHANGES:
        raise _fail(line, f"epoch and attempts must be one of {sorted(CHANGES)}", cell)
    return CHANGES[cell]


def parse_rows(text: str) -> list[Row]:
    """The rows of the one transitions table in ``text``; raises on anything malformed."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == HEADER]
    assert len(starts) == 1, f"expected one transitions table headed {HEADER!r}, found {len(starts)}"
    start = starts[0]
    assert lines[start + 1] == SEPARATOR, f"line {start + 2}: expected {SEPARATOR!r}"
    rows: list[Row] = []
    for i in range(start + 2, len(lines)):
        line, number = lines[i], i + 1
        if not line.startswith("|"):
            break
        if not line.endswith("|"):
            raise _fail(number, "a row must end with '|'", line)
        cells = [cell.strip() for cell in line[1:-1].split("|")]
        if len(cells) != 6:
            raise _fail(number, f"a row needs 6 cells, not {len(cells)}", line)
        method, source, target, epoch, attempts, _notes = cells
        match = _METHOD_CELL.match(method)
        if match is None:
            raise _fail(number, "'method' must be backticked calls joined by ' / ', then 'when ...'", method)
        rows.append(
            Row(
                line=number,
                calls=tuple(re.findall(_CALL, match.group("calls"))),
                condition=match.group("condition") or "",
                sources=_sources(number, source),
                target=_target(number, target),
                epoch=_change(number, epoch),
                attempts=_change(number, attempts),
            )
        )
    assert rows, "the transitions table has no rows"
    return rows


@functools.cache
def doc_text() -> str:
    return DOC.read_text()


@functools.cache
def doc_rows() -> tuple[Row, ...]:
    return tuple(parse_rows(doc_text()))


# ---------------------------------------------------------------- scenarios

SETUP = 0.0  # when the job is added (and claimed, for running)
FINISHED = 1.0  # when a terminal job finished
NOW = 10.0  # when the method is called
LATER = 100.0  # the run_at of a scheduled job: not due at NOW

Call = Callable[[JobTable, Entry], object]
#: What an ``add`` call gets for the job it is about to make.
NO_ENTRY = Entry("none", "t", b"", JobState.READY, 0, None, 1, SETUP, SETUP, -1)


@dataclass(frozen=True)
class Scenario:
    """How to make a row's condition hold: table settings, a preparation, and the calls.

    Each call runs on a fresh table whose job ``"j"`` is in the row's "from"
    state (for ``add``, on an empty table; the entry passed is then a dummy).
    ``prepare`` runs before the call and must leave the job in that state.
    """

    calls: tuple[Call, ...]
    max_retained: int = 100_000
    prepare: Callable[[JobTable, Entry], None] | None = None


def put(table: JobTable, state: JobState) -> Entry:
    """Job ``"j"`` (``max_attempts`` 3) in ``state``, reached through the table's own transitions."""
    run_at = LATER if state is JobState.SCHEDULED else SETUP
    if state is JobState.DEFERRED:
        table.defer_past = 0  # past any bound: deferred; and then no admission behind the test's back
    if state is JobState.WAITING:  # a parent still running (no claim or promote moves it)
        table.add("p", "t", {}, 0, None, 3, SETUP, SETUP)
        table.claim("p")
        table.add_packed("j", "t", msgspec.msgpack.encode({"n": 1}), 0, "key-j", 3, run_at, SETUP, after=("p",))
    else:
        table.add("j", "t", {"n": 1}, 0, "key-j", 3, run_at, SETUP)
    table.defer_past = None
    entry = table.entry("j")
    if state is JobState.RUNNING or state in (JobState.SUCCEEDED, JobState.DEAD):
        table.claim("j")
    if state is JobState.SUCCEEDED:
        table.succeed("j", entry.epoch, "done", FINISHED)
    elif state is JobState.DEAD:
        table.fail("j", entry.epoch, "E: final", None, FINISHED)
    elif state is JobState.CANCELLED:
        table.cancel("j", FINISHED)
    assert entry.state is state
    return entry


def _add(run_at: float) -> Call:
    return lambda table, _: table.add("j", "t", {"n": 1}, 0, "key-j", 3, run_at, NOW)


def _add_packed(run_at: float) -> Call:
    return lambda table, _: table.add_packed("j", "t", msgspec.msgpack.encode({"n": 1}), 0, None, 3, run_at, NOW)


def _add_past_bound(packed: bool) -> Call:
    def call(table: JobTable, _: Entry) -> object:
        if packed:
            return table.add_packed("j", "t", b"", 0, None, 3, NOW, NOW, deferred=True)
        table.defer_past = 0
        return table.add("j", "t", {"n": 1}, 0, "key-j", 3, NOW, NOW)

    return call


def _add_child(table: JobTable, _: Entry) -> object:
    table.add("p", "t", {}, 0, None, 3, LATER, NOW)
    return table.add_packed("j", "t", b"", 0, None, 3, NOW, NOW, after=("p",))


def _admit_due(table: JobTable, _: Entry) -> object:
    table.defer_past = 1
    return table.admit_due(NOW)


def _run_later(table: JobTable, entry: Entry) -> None:
    entry.run_at = LATER


def _refuse_admit_due(table: JobTable, entry: Entry) -> None:
    table.defer_past = 1_000
    assert table.admit_due(1e9) == 0


def _fail_with(retry_at: float | None, traceback: str | None = None) -> Call:
    return lambda table, entry: table.fail("j", entry.epoch, "E: boom", retry_at, NOW, traceback)


def _snooze_until(run_at: float) -> Call:
    return lambda table, entry: table.snooze("j", entry.epoch, run_at, NOW)


def _failed_but_once(table: JobTable, entry: Entry) -> None:
    """Fail the running job until one attempt is left, claiming it again each time."""
    while entry.attempts < entry.max_attempts - 1:
        table.fail("j", entry.epoch, "E: again", SETUP, SETUP)
        table.claim("j")


def _snooze_to_the_limit(table: JobTable, job_id: str) -> None:
    """Snooze the running job ``MAX_SNOOZES`` times, claiming it again each time."""
    entry = table.entry(job_id)
    for _ in range(MAX_SNOOZES):
        assert table.snooze(job_id, entry.epoch, SETUP, SETUP) is entry
        table.claim(job_id)
    assert entry.snoozes == MAX_SNOOZES and entry.attempts == 0


def _snoozed_to_the_limit(table: JobTable, entry: Entry) -> None:
    _snooze_to_the_limit(table, entry.id)


def _finish_another(how: str) -> Call:
    """Finish job ``"k"`` (not the subject) by ``how``: the ``max_retained`` bound applies."""

    def call(table: JobTable, _: Entry) -> object:
        table.add("k", "t", {}, 0, None, 1, NOW, NOW)
        if how == "cancel":
            return table.cancel("k", NOW)
        table.claim("k")
        if how == "snooze":
            _snooze_to_the_limit(table, "k")
        epoch = table.entry("k").epoch
        if how == "succeed":
            return table.succeed("k", epoch, None, NOW)
        if how == "fail":
            return table.fail("k", epoch, "E: k", NOW + 1, NOW)  # max_attempts 1: dead
        assert how == "snooze"
        return table.snooze("k", epoch, NOW + 1, NOW)  # past the limit: dead

    return call


def _give_deadline(deadline: float) -> Callable[[JobTable, Entry], None]:
    """Give the never-claimed job ``deadline``, as ``add(..., deadline=...)`` does (its heap item too)."""

    def prepare(table: JobTable, entry: Entry) -> None:
        entry.deadline = deadline
        heapq.heappush(table._deadlines, (deadline, entry.seq, entry))

    return prepare


def _evict_at(after: float) -> Call:
    def call(table: JobTable, entry: Entry) -> object:
        finished = NOW if entry.finished_at is None else entry.finished_at  # not finished: any time will do
        return table.evict(finished + table.retention + after)

    return call


RUN_AT_DUE = "`run_at <= now`"
RUN_AT_FUTURE = "`run_at > now`"
SCENARIOS: dict[tuple[str, str], Scenario] = {
    ("add", RUN_AT_DUE): Scenario((_add(NOW), _add(NOW - 5))),
    ("add", RUN_AT_FUTURE): Scenario((_add(NOW + 0.5),)),
    ("add_packed", RUN_AT_DUE): Scenario((_add_packed(NOW), _add_packed(SETUP))),
    ("add_packed", RUN_AT_FUTURE): Scenario((_add_packed(LATER),)),
    ("add", "past the admission bound"): Scenario((_add_past_bound(False),)),
    ("add_packed", "past the admission bound"): Scenario((_add_past_bound(True),)),
    ("add_packed", "a parent in `after` has not succeeded"): Scenario((_add_child,)),
    ("admit", RUN_AT_DUE): Scenario((lambda table, _: table.admit("j", NOW),)),
    ("admit", RUN_AT_FUTURE): Scenario((lambda table, _: table.admit("j", NOW),), prepare=_run_later),
    ("admit_due", "fewer than `defer_past` jobs are ready or scheduled"): Scenario((_admit_due,)),
    ("claim", ""): Scenario((lambda table, _: table.claim("j"),)),
    ("claim_next", RUN_AT_DUE): Scenario((lambda table, _: table.claim_next(LATER),)),
    ("promote", RUN_AT_DUE): Scenario((lambda table, _: table.promote(LATER), lambda table, _: table.promote(1e9))),
    ("succeed", ""): Scenario((lambda table, entry: table.succeed("j", entry.epoch, {"ok": [1]}, NOW),)),
    ("fail", "`retry_at > now`"): Scenario((_fail_with(NOW + 1), _fail_with(LATER, "Traceback ..."))),
    ("fail", "`retry_at <= now`"): Scenario((_fail_with(NOW), _fail_with(SETUP, "Traceback ..."))),
    ("fail", "`retry_at` is `None`"): Scenario((_fail_with(None), _fail_with(None, "Traceback ..."))),
    ("fail", "attempts reach `max_attempts`"): Scenario(
        (_fail_with(NOW + 1), _fail_with(SETUP)), prepare=_failed_but_once
    ),
    ("snooze", RUN_AT_FUTURE): Scenario((_snooze_until(NOW + 1), _snooze_until(LATER))),
    ("snooze", RUN_AT_DUE): Scenario((_snooze_until(NOW), _snooze_until(SETUP))),
    ("snooze", "it snoozed `MAX_SNOOZES` times already"): Scenario(
        (_snooze_until(NOW + 1), _snooze_until(SETUP)), prepare=_snoozed_to_the_limit
    ),
    ("release", ""): Scenario((lambda table, entry: table.release("j", entry.epoch),)),
    ("cancel", ""): Scenario((lambda table, _: table.cancel("j", NOW),)),
    ("retry", ""): Scenario((lambda table, _: table.retry("j", NOW),)),
    ("evict", "finished `retention` or more ago"): Scenario((_evict_at(0.0), _evict_at(5.0))),
    ("drop", ""): Scenario((lambda table, _: table.drop("j"),)),
    ("expire", ""): Scenario((lambda table, _: table.expire("j", NOW),), prepare=_give_deadline(NOW)),
    ("expire_due", "the deadline is at or before `now`"): Scenario(
        (lambda table, _: table.expire_due(NOW), lambda table, _: table.expire_due(LATER)), prepare=_give_deadline(NOW)
    ),
    ("_finish", "more than `max_retained` jobs are terminal"): Scenario(
        tuple(_finish_another(how) for how in ("succeed", "fail", "snooze", "cancel")), max_retained=1
    ),
}


# ------------------------------------------------------------------- checks


def check_counts(table: JobTable) -> None:
    """The table's per-state counts agree with its jobs."""
    real = dict.fromkeys(STATES, 0)
    for entry in table.entries():
        real[entry.state.value] += 1
    assert table.counts() == real


def check_change(what: str, change: Change, before: int | None, after: int) -> None:
    """``after`` is what ``change`` makes of ``before`` (``None``: the job did not exist)."""
    if change == "0":
        assert after == 0, f"{what}: expected 0, got {after}"
        return
    assert before is not None, f"{what}: a new job has no earlier value: document it as 0"
    expected = before + 1 if change == "+1" else before
    assert after == expected, f"{what}: expected {change} from {before}, got {after}"


def cases() -> list[tuple[Row, str, JobState | None, int]]:
    """Every (row, method, from state, call index) the doc asks for; None: a job not yet added."""
    out: list[tuple[Row, str, JobState | None, int]] = []
    for row in doc_rows():
        for method in row.methods:
            scenario = SCENARIOS.get((method, row.condition))
            if scenario is None:  # reported by test_every_row_has_a_scenario
                continue
            for source in row.sources or (None,):
                out.extend((row, method, source, i) for i in range(len(scenario.calls)))
    return out


def case_id(case: tuple[Row, str, JobState | None, int]) -> str:
    row, method, source, i = case
    return f"line{row.line}-{method}-from-{'new' if source is None else source.value}-{i}"


def test_the_transitions_table_parses() -> None:
    """The doc has exactly one transitions table and every row of it is well formed."""
    rows = doc_rows()
    assert all(row.calls for row in rows)


@pytest.mark.parametrize(
    "bad",
    [
        "| `succeed(job_id)` | `running` | `succeeded` | +2 | +1 | |",  # unknown change
        "| `succeed(job_id)` | `runing` | `succeeded` | — | +1 | |",  # misspelt state
        "| `succeed(job_id)` | `running` | `succeeded` or `dead` | — | +1 | |",  # two targets
        "| succeed | `running` | `succeeded` | — | +1 | |",  # no backticked call
        "| `succeed(job_id)` | `running` | `succeeded` | — | +1 |",  # a cell short
        "| `succeed(job_id)` | `running` | `succeeded` | — | +1 | a | b |",  # a cell too many
    ],
)
def test_a_malformed_row_fails_loudly(bad: str) -> None:
    """The parser refuses a row it cannot read exactly, rather than skipping it."""
    with pytest.raises(AssertionError, match=r"state_machine\.md line 3:"):
        parse_rows(f"{HEADER}\n{SEPARATOR}\n{bad}\n")


def test_every_row_has_a_scenario_and_every_scenario_a_row() -> None:
    """Each documented (method, condition) is one this test knows how to drive, and none is undocumented."""
    documented = {(method, row.condition) for row in doc_rows() for method in row.methods}
    unknown = sorted(documented - SCENARIOS.keys())
    assert not unknown, f"rows this test cannot drive (add a scenario): {unknown}"
    missing = sorted(SCENARIOS.keys() - documented)
    assert not missing, f"outcomes the doc no longer documents: {missing}"


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_each_row_is_what_the_table_does(case: tuple[Row, str, JobState | None, int]) -> None:
    """From each documented "from" state the call leads to the row's "to", epoch and attempts."""
    row, method, source, i = case
    scenario = SCENARIOS[method, row.condition]
    table = JobTable(max_retained=scenario.max_retained)
    where = f"line {row.line} ({method} from {'no job' if source is None else source.value})"
    before_epoch: int | None = None
    before_attempts: int | None = None
    if source is None:
        scenario.calls[i](table, NO_ENTRY)
        assert "j" in table, f"{where}: the job was not added"
        entry = table.entry("j")
    else:
        entry = put(table, source)
        if scenario.prepare is not None:
            scenario.prepare(table, entry)
            assert entry.state is source
        before_epoch, before_attempts = entry.epoch, entry.attempts
        scenario.calls[i](table, entry)
    if row.target is None:
        assert "j" not in table, f"{where}: expected the job gone, it is {entry.state.value}"
    else:
        assert "j" in table, f"{where}: expected {row.target.value}, the job is gone"
        assert table.entry("j") is entry
        assert entry.state is row.target, f"{where}: expected {row.target.value}, got {entry.state.value}"
    check_change(f"{where} epoch", row.epoch, before_epoch, entry.epoch)
    check_change(f"{where} attempts", row.attempts, before_attempts, entry.attempts)
    check_counts(table)


# How each method refuses a job in a state it does not take, per its own contract.


def _refuse_add(table: JobTable, entry: Entry) -> None:
    with pytest.raises(InvalidJob) as raised:
        table.add("j", "t", {}, 0, None, 3, NOW, NOW)
    assert raised.value.field == "id"


def _refuse_add_packed(table: JobTable, entry: Entry) -> None:
    with pytest.raises(InvalidJob) as raised:
        table.add_packed("j", "t", b"", 0, None, 3, NOW, NOW)
    assert raised.value.field == "id"


def _refuse_by_state_error(call: Callable[[JobTable], object]) -> Callable[[JobTable, Entry], None]:
    def probe(table: JobTable, entry: Entry) -> None:
        with pytest.raises(InvalidJob) as raised:
            call(table)
        assert raised.value.field == "state"

    return probe


def _refuse_by_none(call: Call) -> Callable[[JobTable, Entry], None]:
    def probe(table: JobTable, entry: Entry) -> None:
        assert call(table, entry) is None

    return probe


def _refuse_cancel(table: JobTable, entry: Entry) -> None:
    _, changed, running_epoch = table.cancel("j", NOW)
    assert not changed and running_epoch is None


def _refuse_promote(table: JobTable, entry: Entry) -> None:
    assert table.promote(1e9) == 0


def _refuse_expire_due(table: JobTable) -> None:
    entry = table.entry("j")
    _give_deadline(NOW)(table, entry)  # a started or finished job's deadline no longer applies
    assert table.expire_due(1e9) == 0
    entry.deadline = None  # as it was: the caller compares the job before and after


def _refuse_evict(table: JobTable, entry: Entry) -> None:
    assert table.evict(1e9) == []


def _refuse_finish(table: JobTable, entry: Entry) -> None:
    # max_retained is 0 here: every finish is past the bound, and only the terminal job goes.
    for how in ("succeed", "fail", "snooze", "cancel"):
        _finish_another(how)(table, entry)
        assert "k" not in table, how


PROBES: dict[str, Callable[[JobTable, Entry], None]] = {
    "add": _refuse_add,
    "add_packed": _refuse_add_packed,
    "claim": _refuse_by_state_error(lambda table: table.claim("j")),
    "claim_next": _refuse_by_none(lambda table, _: table.claim_next(1e9)),
    "promote": _refuse_promote,
    "succeed": _refuse_by_none(lambda table, entry: table.succeed("j", entry.epoch, "late", NOW)),
    "fail": _refuse_by_none(lambda table, entry: table.fail("j", entry.epoch, "E: late", None, NOW)),
    "snooze": _refuse_by_none(lambda table, entry: table.snooze("j", entry.epoch, NOW, NOW)),
    "release": _refuse_by_none(lambda table, entry: table.release("j", entry.epoch)),
    "cancel": _refuse_cancel,
    "retry": _refuse_by_state_error(lambda table: table.retry("j", NOW)),
    "evict": _refuse_evict,
    "drop": _refuse_by_state_error(lambda table: table.drop("j")),
    "expire": _refuse_by_state_error(lambda table: table.expire("j", NOW)),
    "expire_due": lambda table, entry: _refuse_expire_due(table),
    "admit": _refuse_by_state_error(lambda table: table.admit("j", NOW)),
    "admit_due": _refuse_admit_due,
    "_finish": _refuse_finish,
}
PROBE_MAX_RETAINED: dict[str, int] = {"_finish": 0}


def refusals() -> list[tuple[str, JobState]]:
    """Every (method, state) the doc leaves out of the method's "from" states."""
    accepted: dict[str, set[JobState]] = {}
    for row in doc_rows():
        for method in row.methods:
            accepted.setdefault(method, set()).update(row.sources)
    return [(method, state) for method, taken in accepted.items() for state in JobState if state not in taken]


@pytest.mark.parametrize(("method", "state"), refusals(), ids=lambda v: v if isinstance(v, str) else v.value)
def test_states_not_listed_as_from_are_refused(method: str, state: JobState) -> None:
    """A method refuses a job in a state its rows do not list, and the job stays as it was."""
    assert method in PROBES, f"no refusal probe for {method}: add one"
    table = JobTable(max_retained=PROBE_MAX_RETAINED.get(method, 100_000))
    entry = put(table, state)
    before: Job = table.get("j")
    PROBES[method](table, entry)
    assert "j" in table, f"{method} took a job in {state.value}: it is gone"
    after = table.get("j")
    assert after == before, f"{method} took a job in {state.value}: it became {after.state.value}"
    check_counts(table)


def test_every_transition_method_is_documented() -> None:
    """Each public JobTable method is either a documented transition or a known non-transition."""
    public = {name for name in vars(JobTable) if not name.startswith("_")}
    assert public >= NOT_TRANSITIONS, f"not JobTable methods any more: {sorted(NOT_TRANSITIONS - public)}"
    documented = {method for row in doc_rows() for method in row.methods}
    undocumented = sorted(public - NOT_TRANSITIONS - documented)
    assert not undocumented, f"transitions missing from docs/state_machine.md: {undocumented}"
    assert not documented & NOT_TRANSITIONS


def test_documented_calls_have_the_methods_signatures() -> None:
    """Each documented call names a JobTable method with its parameters, written out in full at least once."""
    full: set[str] = set()
    for row in doc_rows():
        for method, arguments in row.calls:
            assert hasattr(JobTable, method), f"line {row.line}: JobTable has no method {method}"
            if arguments == "...":
                continue
            params = list(inspect.signature(getattr(JobTable, method)).parameters)[1:]  # without self
            written = [argument.split("=")[0].strip() for argument in arguments.split(",")] if arguments else []
            assert written == params, f"line {row.line}: {method}({arguments}) but the method takes {params}"
            full.add(method)
    documented = {method for row in doc_rows() for method in row.methods}
    assert documented == full, f"written only as (...): {sorted(documented - full)}"


def test_the_doc_states_the_limits_the_model_sets() -> None:
    """Wherever the doc gives ``MAX_SNOOZES`` or ``MAX_ERRORS_KEPT`` a value, it is the model's."""
    for name, value in (("MAX_SNOOZES", MAX_SNOOZES), ("MAX_ERRORS_KEPT", MAX_ERRORS_KEPT)):
        stated = re.findall(rf"`{name}` = (\d+)", doc_text())
        assert stated, f"the doc does not give {name} a value"
        assert all(int(n) == value for n in stated), f"{name} is {value}, the doc says {stated}"


def test_the_outcomes_named_are_the_stores() -> None:
    """The outcome structs and Store methods the doc names exist, with the fields it gives them."""
    section = doc_text().split("## The runtime's outcomes", 1)[1].split("\n## ", 1)[0]
    structs = re.findall(r"`([A-Z]\w*)\(([^`]*)\)`", section)
    assert {name for name, _ in structs} == {"Succeeded", "Failed", "Released", "Snoozed"}
    for name, fields in structs:
        struct = getattr(_base, name)
        assert issubclass(struct, msgspec.Struct)
        assert [f.strip() for f in fields.split(",")] == list(struct.__struct_fields__), name
    methods = re.findall(r"`Store\.(\w+)\(", section)
    assert methods and all(hasattr(_base.Store, method) for method in methods)
    for phrase in ("succeeded", "failed with retry delay", "failed without retry", "released", "snoozed"):
        assert re.search(rf"^- {phrase}: ", section, flags=re.M), phrase


def test_errors_and_snoozes_are_kept_as_the_doc_says() -> None:
    """Failures append the documented tuple to ``errors``, the last ``MAX_ERRORS_KEPT`` across retries;
    a snooze adds to ``snoozes`` only, and ``retry`` resets it with ``attempts``."""
    assert "`(attempt, error, traceback, finished_at)`" in doc_text()
    assert [field.name for field in attrs.fields(FailedAttempt)] == ["attempt", "error", "traceback", "finished_at"]
    table = JobTable()
    entry = put(table, JobState.RUNNING)
    assert table.snooze("j", entry.epoch, SETUP, SETUP) is entry
    assert (entry.snoozes, entry.attempts, entry.errors) == (1, 0, ())
    failures: list[tuple[int, str, str | None, float]] = []
    for n in range(MAX_ERRORS_KEPT + 2):
        table.claim("j")
        error, traceback = f"E: {n}", None if n % 2 else f"Traceback {n}"
        table.fail("j", entry.epoch, error, SETUP, float(n), traceback)
        failures.append((entry.attempts, error, traceback, float(n)))
        if entry.state is JobState.DEAD:
            table.retry("j", float(n))
            assert (entry.attempts, entry.snoozes) == (0, 0)
    assert entry.errors == tuple(failures[-MAX_ERRORS_KEPT:])
    assert table.get("j").errors == tuple(FailedAttempt(*failure) for failure in failures[-MAX_ERRORS_KEPT:])
