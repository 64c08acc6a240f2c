"""The fixtures every conformance case stands on: a harness over the kind under test, an open store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import ClassVar, TypeVar

import pytest

from .._base import Store
from ._harness import ALL_STATES, Harness, StoreKind

__all__ = ["CaseBase", "needs", "zero_counts"]

F = TypeVar("F", bound=Callable[..., object])

#: What a case may need of its kind: the test of it, and the reason to skip without it.
_PROMISES: dict[str, tuple[Callable[[StoreKind], bool], str]] = {
    "checkpoint": (lambda kind: kind.checkpoint is not None, "the store has no checkpoint"),
    "concurrent_sessions": (lambda kind: kind.concurrent_sessions, "the store serves one session at a time"),
    "one_session": (lambda kind: not kind.concurrent_sessions, "the store serves concurrent sessions"),
    "inline_hints": (lambda kind: kind.inline_hints, "the store's hints are not inline: they may come late"),
    "bound_at_finish": (lambda kind: not kind.bound_at_evict, "the store applies max_retained when it evicts"),
    "bound_at_evict": (lambda kind: kind.bound_at_evict, "the store applies max_retained as jobs finish"),
}


def needs(*promises: str) -> Callable[[F], F]:
    """Run the decorated case only for kinds that keep ``promises`` (keys of ``_PROMISES``); skip it otherwise.

    The skip happens in a synchronous fixture, before the case's trio run,
    so that pytest reports its reason.
    """
    unknown = set(promises) - set(_PROMISES)
    if unknown:
        raise ValueError(f"unknown promises {sorted(unknown)}; known: {sorted(_PROMISES)}")

    def mark(case: F) -> F:
        case.conformance_needs = promises  # type: ignore[attr-defined]
        return case

    return mark


def zero_counts(**nonzero: int) -> dict[str, int]:
    """What :meth:`Store.counts` answers with ``nonzero`` jobs in those states and none elsewhere."""
    counts = dict.fromkeys(sorted(ALL_STATES), 0)
    counts.update(nonzero)
    return counts


class CaseBase:
    """The root of the case classes: the ``harness`` and ``store`` fixtures, and the trio marker.

    The kind under test comes from a ``store_kind`` fixture, which the test
    module provides (see :class:`~trioq.stores.conformance.StoreConformance`).
    """

    # Every case is async; with the marker, pytest-trio runs them whether or
    # not the project turned on trio_mode.
    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.trio]

    @pytest.fixture(autouse=True)
    def _skip_unless_promised(self, request: pytest.FixtureRequest, store_kind: StoreKind) -> None:
        """Skip a case (see :func:`needs`) that needs what ``store_kind`` does not promise."""
        for promise in getattr(request.function, "conformance_needs", ()):
            check, reason = _PROMISES[promise]
            if not check(store_kind):
                pytest.skip(reason)

    @pytest.fixture
    def harness(self, store_kind: StoreKind, tmp_path: Path) -> Harness:
        """A harness over ``store_kind``, keeping the store's data under ``tmp_path``."""
        return Harness(store_kind, tmp_path)

    @pytest.fixture
    async def store(self, harness: Harness) -> AsyncIterator[Store]:
        """A fresh store, open in a session with default retention."""
        async with harness.session(harness.make()) as opened:
            yield opened
