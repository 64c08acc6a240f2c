"""Testing helpers: fault plans and checks, usable with or without pytest.

``FaultPlan`` injects failures, hangs, delays and a simulated crash into a
queue (``trioq.open_queue(..., faults=plan)``); the ``pytest_trioq`` plugin
wraps it in fixtures. See ``docs/testing.md``.
"""

from ._exports import show_as_public
from ._testing.checks import assert_all_terminal, crash_points
from ._testing.crashlog import SimulatedCrash
from ._testing.faults import FaultPlan, InjectedFailure, Injection, Rule

__all__ = [
    "FaultPlan",
    "InjectedFailure",
    "Injection",
    "Rule",
    "SimulatedCrash",
    "assert_all_terminal",
    "crash_points",
]

show_as_public(__name__, globals())
del show_as_public
