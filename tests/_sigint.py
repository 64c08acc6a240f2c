"""Children that must see Ctrl-C as a terminal delivers it, whatever the test process's own state is."""

from __future__ import annotations

import signal
import warnings


def default_sigint() -> None:
    """A ``preexec_fn``: SIGINT back to its default disposition and unblocked, in the child before it execs.

    A child inherits an ignored or blocked SIGINT, and Python then never raises ``KeyboardInterrupt``
    in it. In one gate run (2026-12-07) both SIGINT tests hung for their whole timeout inside the full
    suite, and they passed alone (twelve times, under load too). This takes the test process's state
    out of what they check, and
    :func:`warn_if_sigint_is_not_default` says in the test report when that state was not the default.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def warn_if_sigint_is_not_default() -> None:
    """A warning naming this process's SIGINT handler and mask when they are not Python's defaults."""
    handler = signal.getsignal(signal.SIGINT)
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if handler is not signal.default_int_handler or blocked:
        warnings.warn(f"the test process's SIGINT handler is {handler!r}, blocked: {blocked}", stacklevel=2)
