"""The model-based case: a hypothesis state machine drives the store against a reference model."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from ._fixtures import CaseBase
from ._harness import StoreKind

__all__ = ["ModelCases"]


class ModelCases(CaseBase):
    """Random sequences of every call, checked after each step against :mod:`._reference`."""

    #: Examples (sequences of calls) per run; each builds a fresh store.
    model_examples: ClassVar[int] = 100
    #: The most steps (calls) an example takes.
    model_steps: ClassVar[int] = 30

    async def test_model_based_run(self, store_kind: StoreKind, tmp_path: Path) -> None:
        """Adds, claims, outcomes of every kind (stale ones too), extends, cancels, retries, promotes after the
        clock moves, evicts, views and session reopens agree with the reference model at every step:
        states, attempts, epochs, errors, results, run_at and counts.

        A store with ``concurrent_sessions`` is driven through its kind's ``nodes`` (two or three); one
        without is checked to refuse a second session along the way.
        """
        pytest.importorskip("hypothesis")
        from ._machine import run_model

        examples = self.model_examples if store_kind.model_examples is None else store_kind.model_examples
        await run_model(store_kind, tmp_path, max_examples=examples, steps=self.model_steps)
