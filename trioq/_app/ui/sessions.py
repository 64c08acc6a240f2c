"""The dashboard's sessions: who is logged in, and each session's CSRF token.

A session is a random id kept server-side (in this process's memory), sent
to the browser as an ``HttpOnly``, ``SameSite=Strict`` cookie scoped to the
dashboard's path (``Secure`` when the request came over https). The cookie
holds nothing derived from the API token, so it leaks nothing about it; a
restart of the process logs everybody out. Logging out forgets the id, so a
copied cookie stops working too.

Every session carries its own CSRF token, sent back in a hidden field of each
action's form and compared in constant time. Without an API token the
dashboard is open, but actions still need a session (made on the first page
view) and its CSRF token: another site cannot make a visitor's browser cancel
jobs.
"""

from __future__ import annotations

import collections
import hmac
import secrets
import time

import attrs

__all__ = ["COOKIE", "LIFETIME", "MAX_SESSIONS", "Session", "Sessions", "token_matches"]

#: The cookie's name.
COOKIE = "trioq_session"
#: Seconds a session lasts from its login (or its first page view, without a token).
LIFETIME = 12 * 3600.0
#: Sessions kept at most; past it the oldest is forgotten (its browser logs in again).
MAX_SESSIONS = 10_000


@attrs.define
class Session:
    """One browser's session (made by a login, or by a first page view without a token): ``csrf``
    the token its forms must send back; ``flash`` messages for its next page."""

    id: str
    csrf: str
    expires: float
    flash: list[tuple[str, str]] = attrs.Factory(list)

    def say(self, kind: str, message: str) -> None:
        """Show ``message`` on the next page this session loads (``kind``: ``"ok"`` or ``"error"``)."""
        self.flash.append((kind, message))

    def take_flash(self) -> list[tuple[str, str]]:
        """The messages to show now, forgotten once taken."""
        messages, self.flash = self.flash, []
        return messages

    def csrf_ok(self, given: str | None) -> bool:
        """Whether ``given`` (a form's hidden field) is this session's CSRF token, in constant time."""
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self.csrf.encode())


class Sessions:
    """The live sessions of one dashboard, oldest first, bounded by :data:`MAX_SESSIONS`."""

    def __init__(self) -> None:
        self._by_id: collections.OrderedDict[str, Session] = collections.OrderedDict()

    def new(self) -> Session:
        """A fresh session with a new id and CSRF token (a login always makes a new one, so an id
        planted in a browser before the login is never promoted)."""
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.popitem(last=False)
        session = Session(
            id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            expires=time.monotonic() + LIFETIME,
        )
        self._by_id[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id, or ``None`` (unknown, expired, or no id)."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        if session.expires <= time.monotonic():
            del self._by_id[session_id]
            return None
        return session

    def forget(self, session_id: str) -> None:
        """Log that session out (nothing if unknown)."""
        self._by_id.pop(session_id, None)


def token_matches(given: str, token: str) -> bool:
    """Whether a login form's ``given`` token is the API ``token``, compared in constant time."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())
