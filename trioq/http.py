"""The HTTP face of a queue: ``create_app(queue)`` and ``blueprint(queue)`` (Quart-Trio).

Needs the ``http`` extra. See :mod:`trioq._app.http` for the routes.
"""

from ._app.http import blueprint, create_app
from ._exports import show_as_public

__all__ = ["blueprint", "create_app"]

show_as_public(__name__, globals())
del show_as_public
