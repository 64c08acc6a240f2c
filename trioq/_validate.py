"""The checks of the arguments trioq's API takes, in one place.

One rule for what a bad argument raises, by whose data it is:

- A job's own fields (``enqueue``'s and ``JobSpec``'s options, ``wait``'s
  ``timeout``, a ``Backoff``): :class:`~trioq.InvalidJob` with ``field``
  naming the field (``"jobs[3].delay"`` in a batch). This is the caller's data:
  the HTTP API answers it with a 400 naming the field.
- A queue's or a task's configuration (``open_queue``, ``Registry.task``):
  ``ValueError``, and ``TypeError`` where an object of some class (a
  registry, a plan, a flag) is expected and something else came. These are
  the program's own mistakes, found once at start-up.

Every message names the argument, says what it must be, and shows what came
(cut short when long). Numbers refuse ``bool`` (a ``True`` is no count of
seconds) and NaN; ints must fit the stores' 64 bits.
"""

from __future__ import annotations

import math
from typing import Any

from ._model import INT_MAX, INT_MIN, InvalidJob, is_storable_int, label_problem

__all__ = ["exception_types", "flag", "integer", "label", "number", "optional_number", "where"]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."


def _fail(name: str, what: str, value: Any, error: type[Exception]) -> Exception:
    message = f"{name} must be {what}, got {_shown(value)}"
    return InvalidJob(message, field=name) if error is InvalidJob else error(message)


def number(
    name: str,
    value: Any,
    *,
    minimum: float = 0.0,
    above: bool = False,
    infinite: bool = False,
    error: type[Exception] = InvalidJob,
) -> float:
    """``value`` as a float if it is a number ``>= minimum`` (``> minimum`` with ``above``), finite
    unless ``infinite`` (``math.inf`` allowed); else ``error`` (see the module docstring)."""
    try:
        ok = not isinstance(value, bool) and isinstance(value, int | float) and not math.isnan(value)
        ok = ok and (infinite or math.isfinite(value)) and (value > minimum if above else value >= minimum)
    except OverflowError:  # an int too large for a float
        ok = infinite and value > 0
    if not ok:
        bound = f"> {minimum:g}" if above else f">= {minimum:g}"
        kind = "a number" if infinite else "a finite number"
        raise _fail(name, f"{kind} {bound}", value, error)
    return math.inf if infinite and value > INT_MAX else float(value)


def optional_number(
    name: str,
    value: Any,
    *,
    minimum: float = 0.0,
    above: bool = False,
    infinite: bool = False,
    error: type[Exception] = InvalidJob,
) -> float | None:
    """:func:`number`, or ``None`` for ``None``."""
    if value is None:
        return None
    try:
        return number(name, value, minimum=minimum, above=above, infinite=infinite, error=error)
    except error:
        bound = f"> {minimum:g}" if above else f">= {minimum:g}"
        kind = "a number" if infinite else "a finite number"
        raise _fail(name, f"{kind} {bound} or None", value, error) from None


def integer(
    name: str, value: Any, *, minimum: int = INT_MIN, maximum: int = INT_MAX, error: type[Exception] = InvalidJob
) -> int:
    """``value`` if it is an int (not a bool) from ``minimum`` to ``maximum`` (``INT_MAX``: the stores hold 64
    bits; ``INT64_MAX`` for a job's ``priority`` and ``max_attempts``)."""
    if not is_storable_int(value, minimum, maximum):
        raise _fail(name, f"an integer from {minimum} to {maximum}", value, error)
    return value


def label(name: str, value: Any, *, error: type[Exception] = InvalidJob) -> str:
    """``value`` as a plain ``str`` if it can name a queue or a tenant (a non-empty string of at most
    255 bytes of UTF-8, no NUL: :func:`~trioq._model.label_problem`); else ``error``."""
    problem = label_problem(value)
    if problem is not None:
        message = f"{name} {_shown(value)} cannot name a queue or tenant: {problem}"
        raise InvalidJob(message, field=name) if error is InvalidJob else error(message)
    return str.__str__(value)


def flag(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (a truthy string is no flag): else ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_shown(value)}")
    return value


def exception_types(name: str, value: Any) -> tuple[type[BaseException], ...]:
    """``value`` (an exception type, or a tuple of them) as a tuple; else ``TypeError``."""
    types = value if isinstance(value, tuple) else (value,)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"{name} must be an exception type or a tuple of them, got {_shown(t)}")
    return types


def where(index: int | None) -> str:
    """The prefix naming a job of a batch in error messages and fields (``jobs[3].``)."""
    return "" if index is None else f"jobs[{index}]."
