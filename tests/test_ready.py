"""The ready queue against a sorted list: same order for any pushes and pops."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioq.stores.table.ready import Fifo, ReadyQueue

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(-2, 2), st.floats(0, 5, allow_nan=False)),
        st.tuples(st.just("pop")),
        st.tuples(st.just("first")),
    ),
    max_size=80,
)


@given(ops, st.integers(1, 4))
def test_order_matches_a_sorted_model(script: list[tuple], chunk: int) -> None:
    queue = ReadyQueue(chunk)
    model: list[tuple[int, tuple[float, int, str]]] = []
    for seq, op in enumerate(script):
        if op[0] == "push":
            _, priority, run_at = op
            item = (run_at, seq, f"j{seq}")
            queue.push(priority, item)
            model.append((-priority, item))
            model.sort()
        elif op[0] == "pop":
            expected = model.pop(0)[1] if model else None
            assert queue.pop() == expected
        else:
            assert queue.first() == (model[0][1] if model else None)
    drained = []
    while (item := queue.pop()) is not None:
        drained.append(item)
    assert drained == [item for _, item in model]


def test_a_large_backlog_is_a_few_objects_to_the_gc() -> None:
    queue = ReadyQueue()
    for seq in range(50_000):
        queue.push(0, (0.0, seq, f"j{seq}"))
    gc.collect()
    visited: list[object] = []
    for lane in queue._lanes.values():
        visited.extend(gc.get_referents(lane.fifo.full))
    assert len(visited) < 60  # one per chunk of 1,024
    assert not any(gc.is_tracked(chunk) for chunk in visited)


@given(st.lists(st.one_of(st.integers(0, 99), st.none()), max_size=60), st.integers(1, 4))
def test_fifo_is_first_in_first_out(script: list[int | None], chunk: int) -> None:
    fifo: Fifo[int] = Fifo(chunk)
    model: list[int] = []
    for op in script:
        if op is None:
            assert fifo.popleft() == (model.pop(0) if model else None)
        else:
            fifo.append(op)
            model.append(op)
        assert list(fifo) == model
        assert bool(fifo) == bool(model)
        assert fifo.last() == (model[-1] if model else None)
        assert fifo.first() == (model[0] if model else None)


def test_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        Fifo(0)
