"""Limit keys: the registry's limits (``registry.limit``), patterns, and the templates tasks name keys with.

A limit is declared for a key (``"gateway"``) or a pattern (a key ending in
``*``, such as ``"user:*"``: every concrete key it matches has a limit of its
own). A task names the keys its jobs hold with templates filled from the
job's payload and tenant (``"user:{user_id}"``, ``"tenant:{tenant}"``); an
enqueue may add literal keys. Every key a job holds must match a declared
limit: a typo is an error at enqueue, not a limit silently missing.

The stores enforce the limits (:class:`~trioq._model.Limit` says what each
allows); this module only declares, checks and resolves them.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from .. import _validate as validate
from .._model import INT_MAX, Adaptive, InvalidJob, Limit, is_storable_int, label_problem
from .adaptive import AdaptiveCap

__all__ = ["FORGET_AFTER", "MIN_INTERVAL", "LimitBook", "check_templates", "fill_keys"]

#: Seconds after which an adaptive key's controller with nothing in flight is forgotten.
FORGET_AFTER = 600.0

#: The shortest interval between starts a rate may ask for (10,000 a second under one key): below
#: it, float rounding of wall-clock times near 1.7e9 s (and RATE_SLACK) would swallow the bound.
MIN_INTERVAL = 1e-4

_FORMATTER = string.Formatter()


class LimitBook:
    """The limits declared for keys and patterns; :meth:`resolve` finds the one a concrete key has.

    An exact key wins over a pattern; among patterns, the longest prefix wins.
    """

    def __init__(self) -> None:
        self._exact: dict[str, Limit] = {}
        self._patterns: list[tuple[str, Limit]] = []  # (prefix, limit), longest prefix first
        self._adaptive: dict[str, Adaptive] = {}  # declared key or pattern -> its spec
        self._caps: dict[str, AdaptiveCap] = {}  # concrete key -> its controller
        self._next_sweep = -math.inf

    def __bool__(self) -> bool:
        return bool(self._exact) or bool(self._patterns)

    def __iter__(self) -> Iterator[Limit]:
        """Every declared limit, exact keys first, in declaration order."""
        yield from self._exact.values()
        yield from (limit for _, limit in self._patterns)

    def __len__(self) -> int:
        return len(self._exact) + len(self._patterns)

    def declare(
        self,
        key: str,
        *,
        max: int | Adaptive | None = None,
        rate: float | None = None,
        per: float = 1.0,
        burst: int | None = None,
    ) -> Limit:
        """Declare the limit of ``key`` (see ``Registry.limit``); raises ``ValueError`` or ``TypeError``.

        With ``max=Adaptive(min, max)`` the declared limit's ``max`` is ``Adaptive.max`` (the
        hard bound); :meth:`resolve` gives the key's current cap.
        """
        adaptive = max if isinstance(max, Adaptive) else None
        if adaptive is not None:
            max = adaptive.max
        if not isinstance(key, str) or not key:
            raise ValueError(f"a limit's key must be a non-empty string, got {key!r}")
        problem = label_problem(key)
        if problem is not None:
            raise ValueError(f"limit key {key[:60]!r} cannot be stored: {problem}")
        if "*" in key[:-1]:
            raise ValueError(f"limit key {key!r}: '*' may only end a pattern (as in 'user:*')")
        if isinstance(max, bool) or (max is not None and not isinstance(max, int)):
            raise TypeError(f"limit {key!r}: max must be an int >= 1, trioq.Adaptive(min, max) or None, got {max!r}")
        if max is not None:
            validate.integer(f"limit {key!r}: max", max, minimum=1, error=ValueError)
        if rate is not None:
            rate = validate.number(f"limit {key!r}: rate", rate, above=True, error=ValueError)
        per = validate.number(f"limit {key!r}: per", per, above=True, error=ValueError)
        if burst is not None:
            if rate is None:
                raise ValueError(f"limit {key!r}: burst needs a rate")
            validate.integer(f"limit {key!r}: burst", burst, minimum=1, error=ValueError)
            if burst > INT_MAX:
                raise ValueError(f"limit {key!r}: burst is too large")
        if max is None and rate is None:
            raise ValueError(f"limit {key!r} bounds nothing: give max=, rate=, or both")
        if rate is not None:
            interval = per / rate
            if not MIN_INTERVAL <= interval < math.inf or not math.isfinite(((burst or 1) - 1) * interval):
                raise ValueError(
                    f"limit {key!r}: one start every {interval:g} s is out of range; a rate allows at most one"
                    f" start every {MIN_INTERVAL:g} s under one key, and a finite interval"
                )
        if key in self._exact or any(limit.key == key for _, limit in self._patterns):
            raise ValueError(f"a limit for {key!r} is declared already")
        limit = Limit(key, max, rate, per, burst)
        if adaptive is not None:
            self._adaptive[key] = adaptive
        if key.endswith("*"):
            self._patterns.append((key[:-1], limit))
            self._patterns.sort(key=lambda item: -len(item[0]))
        else:
            self._exact[key] = limit
        return limit

    def resolve(self, key: str) -> Limit | None:
        """The limit the concrete ``key`` has: its own, else the longest pattern matching it, else ``None``.

        For an adaptive limit, ``max`` is the key's current cap (each concrete key of a
        pattern has its own; ``Adaptive.min`` for a key no attempt has held lately), so the
        result changes as attempts report: do not cache it. Asking creates no controller.
        """
        limit = self._declared(key)
        if limit is None or limit.key not in self._adaptive:
            return limit
        cap = self._caps.get(key)
        return attrs.evolve(limit, max=self._adaptive[limit.key].min if cap is None else cap.cap)

    @property
    def has_adaptive(self) -> bool:
        """Whether any declared limit is adaptive (attempts holding keys must then report)."""
        return bool(self._adaptive)

    def is_adaptive(self, key: str) -> bool:
        """Whether the limit the concrete ``key`` has is adaptive (its cap moves)."""
        limit = self._declared(key)
        return limit is not None and limit.key in self._adaptive

    def started(self, keys: Sequence[str]) -> None:
        """An attempt holding ``keys`` started; each such call is followed by one :meth:`observe`."""
        for key in keys:
            limit = self._declared(key)
            if limit is not None and limit.key in self._adaptive:
                self._cap(key, limit).started()

    def observe(self, keys: Sequence[str], now: float, latency: float, *, failed: bool = False) -> None:
        """An attempt holding ``keys`` ended: feed it to each adaptive key's controller (others ignore it).

        ``latency=math.nan``: the attempt's outcome was decided elsewhere (a cancel); it only ends.
        A key's controller idle for :data:`FORGET_AFTER` seconds (nothing in flight) is forgotten,
        at most once a minute: per-user keys must not pile up; the key starts again at ``min``.
        """
        for key in keys:
            cap = self._caps.get(key)
            if cap is not None:
                cap.observe(now, latency, failed=failed)
        if now >= self._next_sweep:
            self._next_sweep = now + 60.0
            idle = [key for key, cap in self._caps.items() if cap.inflight == 0 and cap.last_seen < now - FORGET_AFTER]
            for key in idle:
                del self._caps[key]

    def include(self, other: LimitBook) -> None:
        """Declare every limit of ``other`` here; a key declared in both raises ``ValueError``."""
        for limit in other:
            max: int | Adaptive | None = other._adaptive.get(limit.key, limit.max)
            self.declare(limit.key, max=max, rate=limit.rate, per=limit.per, burst=limit.burst)

    def _declared(self, key: str) -> Limit | None:
        found = self._exact.get(key)
        if found is not None:
            return found
        for prefix, limit in self._patterns:
            if key.startswith(prefix):
                return limit
        return None

    def _cap(self, key: str, limit: Limit) -> AdaptiveCap:
        cap = self._caps.get(key)
        if cap is None:
            cap = self._caps[key] = AdaptiveCap(self._adaptive[limit.key])
        return cap


def check_templates(templates: object) -> tuple[str, ...]:
    """A task's ``limits``: a list or tuple of key templates (``"user:{user_id}"``), checked.

    A field is a payload field's name, or ``tenant`` (the job's tenant); no
    attribute, index, conversion or format spec. Raises ``ValueError`` or
    ``TypeError`` naming what is wrong.
    """
    if isinstance(templates, str) or not isinstance(templates, Sequence):
        raise TypeError(f"limits must be a list of key templates, got {templates!r:.60}")
    checked: list[str] = []
    for template in templates:
        if not isinstance(template, str) or not template:
            raise ValueError(f"a limit key template must be a non-empty string, got {template!r}")
        try:
            parts = list(_FORMATTER.parse(template))
        except ValueError as exc:
            raise ValueError(f"limit key template {template!r}: {exc}") from None
        for _, field, spec, conversion in parts:
            if field is None:
                continue
            if not field.isidentifier() or spec or conversion:
                raise ValueError(
                    f"limit key template {template!r}: {{{field}}} must name a payload field or tenant, as"
                    " in 'user:{user_id}' (no attributes, indexes, conversions or format specs)"
                )
        checked.append(template)
    return tuple(checked)


def fill_keys(
    templates: Sequence[str], extra: object, payload: Mapping[str, Any], tenant: str | None, book: LimitBook, where: str
) -> tuple[str, ...]:
    """The concrete keys a job holds: its task's ``templates`` filled in, then ``extra`` (an enqueue's).

    Duplicates are dropped (a key is held once). Raises :class:`~trioq.InvalidJob`
    (``field`` ``"limits"``, prefixed by ``where``) for a field the payload
    lacks, a value that is not a string or an int, a key no declared limit
    matches, or ``extra`` that is not a list of strings.
    """
    field = f"{where}limits"
    keys: list[str] = []
    for template in templates:
        keys.append(_fill(template, payload, tenant, field))
    if extra is not None and not isinstance(extra, list | tuple):
        raise InvalidJob(f"{field} must be a list of limit keys or null, got {extra!r:.60}", field=field)
    if extra:
        for key in extra:
            if not isinstance(key, str) or not key:
                raise InvalidJob(f"{field} must hold non-empty strings, got {key!r:.60}", field=field)
            keys.append(str.__str__(key))
    unique = tuple(dict.fromkeys(keys))
    for key in unique:
        problem = label_problem(key)
        if problem is None and key.endswith("*"):
            problem = "a key ending in '*' names a pattern (declare it with registry.limit), not a key to hold"
        if problem is not None:
            raise InvalidJob(f"{field}: limit key {key[:60]!r} cannot be stored: {problem}", field=field)
        if book.resolve(key) is None:
            raise InvalidJob(
                f"{field}: no limit is declared for key {key[:60]!r}; declare it with registry.limit({key[:60]!r},"
                " max=...) or a pattern such as 'prefix:*'",
                field=field,
            )
    return unique


def _fill(template: str, payload: Mapping[str, Any], tenant: str | None, field: str) -> str:
    pieces: list[str] = []
    for literal, name, _, _ in _FORMATTER.parse(template):
        pieces.append(literal)
        if name is None:
            continue
        if name == "tenant":
            if tenant is None:
                raise InvalidJob(f"{field}: key template {template!r} needs the job's tenant", field=field)
            pieces.append(tenant)
            continue
        if name not in payload:
            raise InvalidJob(f"{field}: key template {template!r} needs payload field {name!r}", field=field)
        value = payload[name]
        if not isinstance(value, str) and not is_storable_int(value):
            # (the repr of an int of thousands of digits raises: say how big it is instead)
            shown = f"an int of {value.bit_length()} bits" if isinstance(value, int) else f"{value!r:.40}"
            raise InvalidJob(
                f"{field}: key template {template!r} takes a string or a 64-bit int from {name!r}, got {shown}",
                field=field,
            )
        pieces.append(str(value))
    return "".join(pieces)
