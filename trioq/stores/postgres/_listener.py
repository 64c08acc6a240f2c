"""One LISTEN connection per node, in a thread of its own, handing each notification to trio.

Notifications are the store's hints between nodes: ``r|node|n`` (``n`` jobs
may have become ready), ``c|node|job_id|epoch`` (a running job was
cancelled), ``f|node|id,id,...`` (jobs finished; ``*``: some did). The
thread reconnects after the connection breaks (a server restart), and says
so, since notifications sent meanwhile are lost: the store then hints as if
anything could have happened. Hints are only hints; the runtime polls too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["listen"]

_log = logging.getLogger("trioq.postgres")


def listen(
    connect: Callable[[], Any],
    channel: str,
    token: trio.lowlevel.TrioToken,
    heard: Callable[[list[str]], None],
    reconnected: Callable[[], None],
    stop: threading.Event,
) -> None:
    """Listen on ``channel`` until ``stop`` is set, calling ``heard(payloads)`` in the trio thread.

    ``connect()`` returns a new autocommit psycopg connection. Once it
    listens, ``reconnected()`` is called in the trio thread (the first time
    too: the store starts serving then).
    Returns within a quarter of a second of ``stop`` being set, or as soon as
    the trio run is gone.
    """
    import psycopg

    backoff = 0.05
    while not stop.is_set():
        try:
            conn = connect()
        except psycopg.OperationalError as exc:
            _log.warning("trioq: the listener cannot connect (%s); retrying in %.2fs", exc, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 2.0)
            continue
        try:
            conn.execute(f'LISTEN "{channel}"')
            trio.from_thread.run_sync(reconnected, trio_token=token)
            backoff = 0.05
            while not stop.is_set():
                batch = [n.payload for n in conn.notifies(timeout=0.25, stop_after=1)]
                # More may be queued already: take them in the same hop to trio.
                if batch:
                    batch.extend(n.payload for n in conn.notifies(timeout=0.0, stop_after=1024))
                    trio.from_thread.run_sync(heard, batch, trio_token=token)
        except psycopg.OperationalError as exc:
            if not stop.is_set():
                _log.warning("trioq: the listener lost its connection (%s); reconnecting", exc)
                time.sleep(backoff)
        except trio.RunFinishedError:
            return
        finally:
            conn.close()
