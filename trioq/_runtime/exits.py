"""What a handler's exception makes of its attempt: a failure, a deadline, or a stop.

A handler's own errors and exits (``SystemExit``, ``KeyboardInterrupt`` or any
``BaseException`` it raises) fail its attempt. Two things instead go on up
and out of the worker: a cancel from outside the attempt (shutdown), and a
real signal to this process, which stops the queue as Ctrl-C should.

Telling a real signal from a handler's own ``raise``: a signal reaches Python
code through its handler. trio's SIGINT handler (or a program's own, for
SIGTERM) raises in whatever code runs when the signal lands, so the frame of a
Python handler (one installed now, or since the worker pool started) is in the
exception's traceback, called with the interrupted frame (the traceback's
entry before it) as an argument (or inside ``*args``); a handler function
that a job merely calls has no such argument. A C handler (a program routing
SIGTERM to ``signal.default_int_handler``) leaves no frame: its
``KeyboardInterrupt`` then comes out of an instruction that is no ``raise``,
which is only looked at for async handlers (a thread's exception is raised
again by trio, a process's rebuilt from a pickle). Threads and
trio-parallel's worker processes never run signal handlers (and
trio-parallel's workers ignore SIGINT), so their own exits are always their
own. A signal's exception is looked for in the handler's exception, its
groups, and behind them in ``__context__`` and ``__cause__``.

Known limits: a job that throws ``KeyboardInterrupt`` into a generator
(``gen.throw``) while a C handler is installed looks like a signal; a job that
calls a Python signal handler passing it its own frame looks like one too.
"""

from __future__ import annotations

import dis
import functools
import logging
import signal
from types import CodeType, TracebackType
from typing import Any

import trio

from .._model import error_text

__all__ = ["SignalHandlers", "attempt_failure", "failure_text", "leaves", "primary_error", "without_cancelled"]

_log = logging.getLogger("trioq")

_RAISES = frozenset({dis.opmap["RAISE_VARARGS"], dis.opmap["RERAISE"]})


def without_cancelled(exc: BaseException) -> BaseException | None:
    """``exc`` with every ``trio.Cancelled`` taken out, or ``None`` if nothing else is left."""
    if isinstance(exc, trio.Cancelled):
        return None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1]
    return exc


def attempt_failure(exc: BaseException, deadline_hit: bool, kind: str, signals: SignalHandlers) -> BaseException | None:
    """What fails an attempt whose handler raised ``exc``; raises if it must go on instead.

    ``deadline_hit``: the attempt's own scope was cancelled (its deadline, or
    a cancel of its job); a ``Cancelled`` alone then gives ``None``: the
    deadline stopped it. Otherwise the exception that failed the attempt is
    returned (``exc`` with any ``Cancelled`` taken out of its groups); its
    text is :func:`failure_text`.
    A ``Cancelled`` from further out (shutdown) is raised again. So is a real
    signal's exception found anywhere in ``exc``: itself, in its groups, or
    behind it in the ``__context__`` or ``__cause__`` chain (a cleanup that
    failed while Ctrl-C unwound the handler; ``except KeyboardInterrupt:
    sys.exit(130)``): the queue stops as Ctrl-C should. Everything else is
    the attempt's error, ``SystemExit`` and ``KeyboardInterrupt`` included,
    saying what happened. ``kind`` is the handler's: only an async handler
    runs where a C signal handler can interrupt it.
    """
    rest = without_cancelled(exc)
    if rest is None:
        if deadline_hit:
            return None
        raise exc
    signalled, on_top = _signal_in(rest, kind, signals)
    if signalled is not None:
        if on_top:
            raise exc
        raise signalled
    return rest


def failure_text(exc: BaseException) -> str:
    """The error text (``"Type: message"``) of an attempt that :func:`attempt_failure` says ``exc`` failed.

    A ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` of
    the handler's own (alone, or the first in a group of its nurseries) says
    what the handler did.
    """
    if isinstance(exc, Exception):
        return error_text(exc)
    found = leaves(exc)
    leaf = next((e for e in found if not isinstance(e, Exception)), found[0] if found else exc)
    if isinstance(leaf, SystemExit):
        # From args, not .code: one unpickled from a worker process has no code.
        code = leaf.args[0] if len(leaf.args) == 1 else leaf.args or None
        return error_text(leaf, f"the handler called sys.exit({code!r}) (or raised SystemExit); its attempt failed")
    if isinstance(leaf, KeyboardInterrupt):
        return error_text(leaf, "the handler raised KeyboardInterrupt itself (no signal arrived); its attempt failed")
    return error_text(exc)


#: How many exceptions :func:`_signal_in` looks at, at most (groups, contexts and causes).
_SEARCH_LIMIT = 256


def _signal_in(exc: BaseException, kind: str, signals: SignalHandlers) -> tuple[BaseException | None, bool]:
    """A real signal's exception in ``exc``, and whether it is one of ``exc``'s own leaves
    (not only behind them, in a context or cause chain).

    Only ``BaseException`` s that are not ``Exception`` s are asked (a signal
    raises ``KeyboardInterrupt`` or, by a program's handler, ``SystemExit``),
    so the common failure, an ``Exception`` with nothing such behind it,
    costs a walk and no look at the installed handlers.
    """
    pending: list[tuple[BaseException, bool]] = [(exc, True)]
    seen: set[int] = set()
    c_handler: bool | None = None  # the installed handlers, looked at once, when first needed
    while pending and len(seen) < _SEARCH_LIMIT:
        current, on_top = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            pending.extend((leaf, on_top) for leaf in current.exceptions)
        elif not isinstance(current, Exception):
            if c_handler is None:
                c_handler = signals.look()
            if signals.raised(current, kind, c_handler):
                return current, on_top
        for behind in (current.__context__, current.__cause__):
            if behind is not None:
                pending.append((behind, False))
    return None, False


class SignalHandlers:
    """The signal handlers this process has had since the worker pool started.

    A handler that resets itself before raising (``signal.signal(signum,
    SIG_DFL)`` and then ``sys.exit()``) is no longer installed when its
    exception is looked at: the ones seen before are remembered.
    """

    def __init__(self) -> None:
        self._codes: set[CodeType] = set()
        self.look()

    def look(self) -> bool:
        """Remember the Python handlers installed now; whether ``signal.default_int_handler`` is one."""
        c_handler = False
        for signum in signal.valid_signals():
            try:
                installed = signal.getsignal(signum)
            except (OSError, ValueError):  # a signal number this platform cannot query
                continue
            if installed is signal.default_int_handler:
                c_handler = True
            code = _code_of(installed)
            if code is not None:
                self._codes.add(code)
        return c_handler

    def raised(self, exc: BaseException, kind: str, c_handler: bool) -> bool:
        """Whether ``exc`` (a leaf, not a group) was raised by a signal's handler in this process.

        ``c_handler``: what the last :meth:`look` said. See the module
        docstring for how it tells; the C-handler rule applies to async
        handlers only (a thread's or process's exception is raised again by
        trio, or rebuilt from a pickle, with no instruction to read).
        """
        if _handler_frame_in(exc.__traceback__, self._codes):
            return True
        return kind == "async" and c_handler and isinstance(exc, KeyboardInterrupt) and not _raised_by_a_raise(exc)


def _code_of(handler: Any) -> CodeType | None:
    """The code object a Python signal handler runs (through partials, methods, callable objects)."""
    for _ in range(10):  # partials of partials: a few levels, never a loop
        if isinstance(handler, functools.partial):
            handler = handler.func
        else:
            break
    function = getattr(handler, "__func__", handler)
    code = getattr(function, "__code__", None)
    if isinstance(code, CodeType):
        return code
    # A callable object: its class's __call__ (wherever in the MRO it is defined).
    call = next((cls.__dict__["__call__"] for cls in type(handler).__mro__ if "__call__" in cls.__dict__), None)
    code = getattr(getattr(call, "__func__", call), "__code__", None)
    return code if isinstance(code, CodeType) else None


def _handler_frame_in(tb: TracebackType | None, codes: set[CodeType]) -> bool:
    """Whether a frame of ``tb`` runs a handler in ``codes`` as the interpreter calls one:
    with the frame it interrupted (the traceback's entry before) among its arguments."""
    previous: TracebackType | None = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code in codes and previous is not None:
            interrupted = previous.tb_frame
            for value in frame.f_locals.values():  # a parameter, or inside *args
                if value is interrupted or (type(value) is tuple and any(item is interrupted for item in value)):
                    return True
        previous, tb = tb, tb.tb_next
    return False


def _raised_by_a_raise(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a ``raise`` statement (not out of a C signal handler
    interrupting some other instruction or a call)."""
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] in _RAISES


# ------------------------------------------------------ what open_queue raises


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions in ``exc`` (itself, or every one nested in its groups) but ``trio.Cancelled``,
    each once, in order."""
    found: list[BaseException] = []
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending[:0] = current.exceptions
        elif not isinstance(current, trio.Cancelled) and all(current is not seen for seen in found):
            found.append(current)
    return found


def _rank(exc: BaseException, body: set[int]) -> int:
    """Which error of several comes out of ``open_queue`` (lowest first): a Ctrl-C
    looks like a Ctrl-C, an exit like an exit, then the body's own error."""
    if isinstance(exc, KeyboardInterrupt):
        return 0
    if isinstance(exc, SystemExit):
        return 1
    if not isinstance(exc, Exception):
        return 2
    return 3 if id(exc) in body else 4


def primary_error(group: BaseExceptionGroup[BaseException], body: BaseException | None) -> BaseException:
    """The one error ``open_queue`` raises for ``group`` (the group itself if it holds only cancellations).

    When everything in it is the body's (``body``, the exception that left the
    ``async with`` block), that is raised as it was: a group the body raised on
    purpose stays a group. Otherwise the group's leaves, less ``trio.Cancelled``
    and less any error that is the ``__cause__`` of another (a WAL writer's
    error and its copies raised to each waiter), are ranked by :func:`_rank`,
    ties going to the first in the group. The others are logged to the
    ``trioq`` logger with their tracebacks and named in a note on the primary,
    so nothing is lost and nothing is wrapped.
    """
    found = leaves(group)
    if not found:
        return group
    from_body = {id(exc) for exc in leaves(body)} if body is not None else set()
    if all(id(exc) in from_body for exc in found):
        assert body is not None
        if not isinstance(body, BaseExceptionGroup) or body.subgroup(trio.Cancelled) is None:
            return body
        return without_cancelled(body) or found[0]
    # Only copies give way (the same type): a different error raised from a
    # Ctrl-C must not hide the Ctrl-C.
    causes = {id(exc.__cause__) for exc in found if type(exc.__cause__) is type(exc)}
    found = [exc for exc in found if id(exc) not in causes] or found
    primary = min(found, key=lambda exc: _rank(exc, from_body))
    others = [exc for exc in found if exc is not primary]
    for other in others:
        _log.error(
            "trioq: %s came out of the queue as it stopped, beside %s (which is raised)",
            type(other).__qualname__,
            type(primary).__qualname__,
            exc_info=other,
        )
    if others:
        named = "; ".join(error_text(exc)[:200] for exc in others)
        primary.add_note(f"trioq: the queue also stopped with {len(others)} more error(s), logged to 'trioq': {named}")
    return primary
