"""Clients of a trioq service (``trioq serve``, or an app with :func:`trioq.http.blueprint`) for producers
that are not trio: ``Client`` (synchronous) and ``AsyncClient`` (asyncio or trio).

Needs the ``client`` extra (``pip install "trioq[client]"``: httpx). See :mod:`trioq._client`.
"""

from ._client import AsyncClient, Client
from ._exports import show_as_public

__all__ = ["AsyncClient", "Client"]

show_as_public(__name__, globals())
del show_as_public
