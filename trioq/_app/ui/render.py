"""Pages from the templates next to this module, with the headers every dashboard page carries.

The Jinja environment is the dashboard's own (not the host app's), with
autoescaping on for every template: each value a template prints (a payload,
a task or queue name, an error, a traceback) is HTML-escaped unless the
template marks it safe, and none does. JSON is shown as text inside
``<pre>``, escaped the same way.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import jinja2
from quart import Response

__all__ = ["HEADERS", "page", "when", "ago", "as_json"]

#: No inline script or style, nothing from another origin, no framing.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none';"
    " base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def when(at: float | None, precise: bool = False) -> str:
    """A wall-clock time as ``YYYY-MM-DD HH:MM:SS UTC`` (``precise``: with milliseconds; ``"-"`` for
    ``None``)."""
    if at is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{moment.microsecond // 1000:03d} UTC" if precise else f"{text} UTC"


def ago(at: float | None, now: float | None = None) -> str:
    """How long before (``"5s ago"``) or after (``"in 2m"``) now a wall-clock time is."""
    if at is None:
        return ""
    delta = (time.time() if now is None else now) - at
    size = abs(delta)
    if size < 1:
        return "now"
    if size < 120:
        text = f"{size:.0f}s"
    elif size < 7200:
        text = f"{size / 60:.0f}m"
    elif size < 172800:
        text = f"{size / 3600:.0f}h"
    else:
        text = f"{size / 86400:.0f}d"
    return f"{text} ago" if delta > 0 else f"in {text}"


def as_json(value: Any) -> str:
    """``value`` as indented JSON text (escaped by the template like any text)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=repr)


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("trioq._app.ui", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(when=when, ago=ago, json=as_json)


def page(name: str, status: int = 200, /, **context: Any) -> Response:
    """The template ``name`` rendered with ``context``, as an HTML response with :data:`HEADERS`."""
    body = _env.get_template(name).render(**context)
    return Response(body, status=status, headers=HEADERS, content_type="text/html; charset=utf-8")
