"""The shop's registry for ``trioq worker`` processes, with the process's shop built as it is loaded::

    PYTHONPATH=examples SHOP_DSN=... SHOP_GATEWAY=http://127.0.0.1:PORT \\
        trioq worker --postgres DSN --app shop.worker:registry

``trioq worker`` imports this module before its node claims anything, so the
shop the handlers use (:func:`shop.app.current`, from ``SHOP_DSN`` and
``SHOP_GATEWAY``: the database's pool, the gateway's HTTP client) is ready
before the first attempt. Built lazily instead, by the first handler, it cost
that attempt 0.3-1.2 s of the process's event loop (httpx's import, its TLS
context) between the start the ``gateway`` limit allowed and the request: the
worker's first charges reached the gateway over a second late, bunched with
the charges started after them.
"""

from __future__ import annotations

from .app import current, registry

__all__ = ["registry"]

current()
