"""The web dashboard: server-rendered pages under ``/ui`` of the HTTP app (see :mod:`.routes`)."""

from .routes import is_ui_request, ui_blueprint

__all__ = ["is_ui_request", "ui_blueprint"]
