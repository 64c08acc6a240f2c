"""pytest_trioq: fault injection for tests of trio apps that use trioq.

Registered through the ``pytest11`` entry point, so installing trioq is
enough. It is a thin face over :mod:`trioq.testing`:

- ``trioq_faults``: a fresh, seeded :class:`trioq.testing.FaultPlan` per test;
- ``trioq_open_queue``: ``trioq.open_queue`` with that plan applied;
- ``@pytest.mark.trioq_faults(fail=..., hang=..., delay=..., task=..., when=..., seed=...)``:
  the same plan, declared on the test;
- ``--trioq-seed=N``: seed every plan with ``N``. By default a test's seed is
  derived from its node id, so runs repeat. A failing test that used a plan
  gets a report section with its seed, the option that replays it, and the
  faults injected.

Loading the plugin imports only pytest: trioq itself is imported when a test
first asks for one of the fixtures.
"""

from __future__ import annotations

import functools
import hashlib
import shlex
from collections.abc import Callable, Generator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from trioq import Queue
    from trioq.testing import FaultPlan

__all__ = ["seed_for"]

_PLAN = pytest.StashKey["FaultPlan"]()
_MARKER = "trioq_faults"
_MARKER_ARGS = frozenset({"fail", "hang", "delay", "task", "when", "seed", "error"})


def seed_for(nodeid: str) -> int:
    """The default seed of the test ``nodeid``: stable across runs and machines."""
    return int.from_bytes(hashlib.blake2b(nodeid.encode(), digest_size=4).digest(), "big")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trioq", "trioq fault injection")
    group.addoption(
        "--trioq-seed",
        type=int,
        default=None,
        metavar="N",
        help="seed every trioq_faults plan with N (the failure report of a test names the N that replays it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(fail=None, hang=None, delay=None, task='*', when='before', seed=None, error=None): "
        "inject faults through the trioq_faults / trioq_open_queue fixtures. fail/hang: an int N (first N "
        "attempts of each job), a float p (each attempt with probability p), True (every attempt) or "
        "False/0 (off); "
        "delay: seconds before every attempt; task: a task name or a list of them ('*' = every task).",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(_MARKER) is not None and _MARKER not in getattr(item, "fixturenames", ()):
        _usage_error(
            f"{item.nodeid}: the trioq_faults marker acts through the trioq_faults or trioq_open_queue "
            "fixture; request one of them (and open the queue with trioq_open_queue)"
        )


@pytest.fixture
def trioq_faults(request: pytest.FixtureRequest) -> FaultPlan:
    """A fresh :class:`trioq.testing.FaultPlan` for this test, seeded, with its markers applied.

    The seed is ``--trioq-seed`` if given, else the marker's ``seed``, else one
    derived from the test's node id.
    """
    from trioq.testing import FaultPlan

    markers = list(request.node.iter_markers(_MARKER))  # closest first
    seed: int | None = request.config.getoption("trioq_seed")
    if seed is None:
        marked = [m.kwargs["seed"] for m in markers if m.kwargs.get("seed") is not None]
        seed = marked[0] if marked else seed_for(request.node.nodeid)
    plan = FaultPlan(seed=seed)
    for marker in markers:
        _apply_marker(plan, marker, request.node.nodeid)
    request.node.stash[_PLAN] = plan
    return plan


@pytest.fixture
def trioq_open_queue(
    trioq_faults: FaultPlan,
) -> Callable[..., AbstractAsyncContextManager[Queue]]:
    """``trioq.open_queue``, same signature, applying this test's ``trioq_faults`` plan.

    A MemoryStore unless ``store=`` says otherwise; pass ``faults=None`` to
    open a queue without the plan (``faults=other`` for another one).
    """
    import trioq

    @functools.wraps(trioq.open_queue)
    def open_queue(registry: trioq.Registry, **options: Any) -> AbstractAsyncContextManager[Queue]:
        options.setdefault("faults", trioq_faults)
        return trioq.open_queue(registry, **options)

    return open_queue


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    plan = item.stash.get(_PLAN, None)
    if plan is not None and report.failed:
        text = describe(plan, item.nodeid)
        longrepr = report.longrepr
        if hasattr(longrepr, "addsection"):
            longrepr.addsection("trioq faults", text)
        else:
            report.sections.append(("trioq faults", text))
    return report


def describe(plan: FaultPlan, nodeid: str) -> str:
    """The report section of a failed test: seed, how to replay, what was injected.

    The node id (like the ``FAILED`` lines) is relative to pytest's rootdir:
    the replay command runs from there.
    """
    lines = [
        f"seed: {plan.seed}",
        f"replay: pytest {shlex.quote(nodeid)} --trioq-seed={plan.seed}",
        f"plan: {plan!r}",
        f"injected faults ({len(plan.injected)}):",
    ]
    lines.extend(f"  {injection}" for injection in plan.injected)
    if not plan.injected:
        lines.append("  (none)")
    return "\n".join(lines)


def _usage_error(message: str) -> NoReturn:
    """Fail the test (not the session) with ``message`` and no traceback."""
    pytest.fail(message, pytrace=False)


def _amount(name: str, value: Any, where: str) -> dict[str, Any] | None:
    """A marker's ``fail=``/``hang=`` value as FaultPlan arguments; None when it is off."""
    if value is True:
        return {}
    if value is False or (isinstance(value, int) and value == 0):
        return None  # off: a parametrised test can turn a fault off without dropping the marker
    if isinstance(value, int) and value >= 1:
        return {"times": value}
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        return {"prob": value}  # 0.0 never hits, as FaultPlan's prob=0.0
    _usage_error(
        f"{where}: trioq_faults({name}={value!r}): give an int N >= 0 (the first N attempts of each job; 0 is "
        "off), a float p in [0, 1] (each attempt with probability p), True (every attempt) or False (off)"
    )


def _apply_marker(plan: FaultPlan, marker: pytest.Mark, where: str) -> None:
    unknown = set(marker.kwargs) - _MARKER_ARGS
    if marker.args or unknown:
        _usage_error(
            f"{where}: the trioq_faults marker takes keyword arguments only, of {sorted(_MARKER_ARGS)}; "
            f"got {list(marker.args) + sorted(unknown)}"
        )
    task = marker.kwargs.get("task", "*")
    tasks = [task] if isinstance(task, str) else list(task)
    when = marker.kwargs.get("when", "before")
    fail, hang, delay = (marker.kwargs.get(name) for name in ("fail", "hang", "delay"))
    if fail is None and hang is None and delay is None and "seed" not in marker.kwargs:
        _usage_error(f"{where}: the trioq_faults marker needs fail=, hang=, delay= or seed=")
    try:
        for name in tasks:
            if delay is not None:
                plan.delay(name, delay)
            if fail is not None and (amount := _amount("fail", fail, where)) is not None:
                plan.fail(name, when=when, error=marker.kwargs.get("error"), **amount)
            if hang is not None and (amount := _amount("hang", hang, where)) is not None:
                plan.hang(name, when=when, **amount)
    except ValueError as exc:
        _usage_error(f"{where}: trioq_faults marker: {exc}")
