"""What a handler's exception makes of its attempt: a failure, a deadline, or a stop.

A handler's own errors and exits (``SystemExit``, ``KeyboardInterrupt`` or any
``BaseException`` it raises) fail its attempt. Two things instead go on up
and out of the worker: a cancel from outside the attempt (shutdown), and a
real signal to this process, which stops the queue as Ctrl-C should.

Telling a real signal from a handler's own ``raise``: a signal reaches Python
code through its handler. trio's SIGINT handler (or a program's own, for
SIGTERM) raises in whatever code runs when the signal lands, so the frame of a
Python handler installed now is in the exception's traceback, called with the
interrupted frame (the traceback's entry before it) as its argument; a handler
function that a job merely calls has no such argument. A C handler (a program
routing SIGTERM to ``signal.default_int_handler``) leaves no frame: its
``KeyboardInterrupt`` then comes out of an instruction that is no ``raise``.
Threads and trio-parallel's worker processes never run signal handlers (and
trio-parallel's workers ignore SIGINT), so their exits are always their own.
"""

from __future__ import annotations

import dis
import functools
import signal
from types import CodeType, TracebackType
from typing import Any

import trio

from ._model import error_text

__all__ = ["DEADLINE", "attempt_error", "raised_by_signal", "without_cancelled"]

#: The error marker for "the worker's scope stopped the handler" (deadline or cancel).
DEADLINE = "<deadline>"

_RAISES = frozenset({dis.opmap["RAISE_VARARGS"], dis.opmap["RERAISE"]})


def without_cancelled(exc: BaseException) -> BaseException | None:
    """``exc`` with every ``trio.Cancelled`` taken out, or ``None`` if nothing else is left."""
    if isinstance(exc, trio.Cancelled):
        return None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1]
    return exc


def attempt_error(exc: BaseException, deadline_hit: bool) -> str:
    """The error text of an attempt whose handler raised ``exc``; raises ``exc`` if it must go on.

    ``deadline_hit``: the attempt's own scope was cancelled (its deadline, or
    a cancel of its job); a ``Cancelled`` alone then gives :data:`DEADLINE`.
    A ``Cancelled`` from further out (shutdown) and a real signal are raised
    again; so is an error whose context holds a real signal's exception (the
    handler's cleanup failed while Ctrl-C unwound it: the Ctrl-C still stops
    the queue). Everything else is the attempt's error, ``SystemExit`` and
    ``KeyboardInterrupt`` included, saying what happened.
    """
    rest = without_cancelled(exc)
    if rest is None:
        if deadline_hit:
            return DEADLINE
        raise exc
    if isinstance(rest, Exception):
        signalled = _signal_behind(rest)
        if signalled is not None:
            raise signalled
        return error_text(rest)
    if raised_by_signal(rest):
        raise exc
    return _exit_text(rest)


def _exit_text(exc: BaseException) -> str:
    """The error of an attempt whose handler raised ``SystemExit``, ``KeyboardInterrupt`` or
    another ``BaseException`` of its own (alone, or the first in a group of its nurseries)."""
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup):
        leaf = next((e for e in leaf.exceptions if not isinstance(e, Exception)), leaf.exceptions[0])
    if isinstance(leaf, SystemExit):
        # From args, not .code: one unpickled from a worker process has no code.
        code = leaf.args[0] if len(leaf.args) == 1 else leaf.args or None
        return error_text(leaf, f"the handler called sys.exit({code!r}) (or raised SystemExit); its attempt failed")
    if isinstance(leaf, KeyboardInterrupt):
        return error_text(leaf, "the handler raised KeyboardInterrupt itself (no signal arrived); its attempt failed")
    return error_text(exc)


def _signal_behind(exc: Exception) -> BaseException | None:
    """A real signal's exception in the ``__context__`` chain of ``exc``, if there is one."""
    seen: set[int] = set()
    context = exc.__context__
    while context is not None and id(context) not in seen:
        seen.add(id(context))
        if not isinstance(context, Exception) and raised_by_signal(context):
            return context
        context = context.__context__
    return None


def raised_by_signal(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in it, for a group) was raised by a signal's handler.

    See the module docstring for how it tells.
    """
    codes: set[CodeType] = set()
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
            codes.add(code)
    pending = [exc]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
            continue
        if _handler_frame_in(current.__traceback__, codes):
            return True
        if c_handler and isinstance(current, KeyboardInterrupt) and not _raised_by_a_raise(current):
            return True
    return False


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
            if any(value is interrupted for value in frame.f_locals.values()):
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
