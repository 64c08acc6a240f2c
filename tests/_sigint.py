"""Children that must see Ctrl-C as a terminal delivers it, whatever the test process's own state is."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """A ``preexec_fn``: SIGINT back to its default disposition and unblocked, in the child before it execs.

    A child inherits an ignored or blocked SIGINT, and Python then never raises ``KeyboardInterrupt``
    in it. A shell without job control starts a background command (``cmd &``) with SIGINT ignored
    (POSIX), so a suite started that way (``nohup bash .ci/run &``) had both SIGINT tests hang for
    their whole timeout: the test process, and every child it started, ignored SIGINT.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
