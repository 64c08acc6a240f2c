"""PostgresStore's gatherer: concurrent adds in one statement, each caller's rows kept together, and the
Store rule for cancels (a call cancelled before its rows are taken adds nothing; once taken, it gets its
answer). No database: the statement is a stand-in."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trioq.stores.postgres._gather import Gatherer


class _Statement:
    """Stands in for the INSERT: records each batch of rows, answers each row doubled, after 1 s."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    async def __call__(self, rows: list[int]) -> list[int]:
        self.batches.append(list(rows))
        await trio.sleep(1.0)
        return [row * 2 for row in rows]


async def test_calls_made_while_a_statement_runs_go_in_the_next_one_together(
    autojump_clock: trio.testing.MockClock,
) -> None:
    statement = _Statement()
    gatherer = Gatherer(statement)
    answers: dict[int, list[int]] = {}

    async def call(n: int, rows: list[int]) -> None:
        answers[n] = await gatherer.call(rows)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gatherer.run)
        nursery.start_soon(call, 0, [1])
        await trio.sleep(0.1)  # the first statement is in flight
        for n in range(1, 4):
            nursery.start_soon(call, n, [10 * n, 10 * n + 1])
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    first, second = statement.batches
    assert first == [1]
    # One statement for the three calls (in whichever order trio ran them), each call's rows together.
    assert sorted(zip(second[::2], second[1::2], strict=True)) == [(10, 11), (20, 21), (30, 31)]
    assert answers == {0: [2], 1: [20, 22], 2: [40, 42], 3: [60, 62]}


async def test_a_call_cancelled_before_it_is_taken_adds_nothing_and_one_taken_gets_its_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    statement = _Statement()
    gatherer = Gatherer(statement)
    got: list[list[int]] = []
    delivered: list[bool] = []

    async def taken_then_cancelled(scope: trio.CancelScope) -> None:
        with scope:
            got.append(await gatherer.call([7]))  # cancelled while in flight: waits for the answer
            await trio.lowlevel.checkpoint()  # and the cancel comes here
        delivered.append(scope.cancelled_caught)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gatherer.run)
        scope = trio.CancelScope()
        nursery.start_soon(taken_then_cancelled, scope)
        await trio.sleep(0.01)  # [7] is in flight
        with trio.move_on_after(0.02):  # waits behind it (not stalled yet), never taken
            await gatherer.call([8])
        scope.cancel()
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert statement.batches == [[7]]  # [8] was never sent
    assert got == [[14]]
    assert delivered == [True]


async def test_calls_waiting_when_the_store_closes_are_sent_and_later_ones_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    statement = _Statement()
    gatherer: Gatherer[int, int] = Gatherer(statement)
    outcomes: dict[int, object] = {}

    async def call(n: int) -> None:
        outcomes[n] = await gatherer.call([n])

    async with trio.open_nursery() as callers, trio.open_nursery() as store:
        store.start_soon(gatherer.run)
        callers.start_soon(call, 1)
        await trio.sleep(0.1)  # [1] is in flight
        callers.start_soon(call, 2)
        await trio.sleep(0.1)  # [2] waits behind it
        store.cancel_scope.cancel()  # the store closes
    assert outcomes == {1: [2], 2: [4]}
    assert statement.batches == [[1], [2]]
    with pytest.raises(RuntimeError, match="nothing was added"):
        await gatherer.call([3])
    assert statement.batches == [[1], [2]]


async def test_calls_behind_a_stalled_statement_go_beside_it_at_most_four_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A statement that waits on a lock (another transaction's key) holds up no other add: once it has
    been out STALLED, what accumulated goes in a statement of its own, up to MAX_IN_FLIGHT at once."""
    release = trio.Event()
    batches: list[list[int]] = []

    async def statement(rows: list[int]) -> list[int]:
        batches.append(list(rows))
        if rows[0] < 0:
            await release.wait()  # waits on a lock
        else:
            await trio.sleep(0.01)
        return rows

    gatherer: Gatherer[int, int] = Gatherer(statement)
    answered: dict[int, float] = {}

    async def call(n: int) -> None:
        await gatherer.call([n])
        answered[n] = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gatherer.run)
        for n in (-1, -2, -3, -4):  # four stalled statements, each sent once the one before stalled
            nursery.start_soon(call, n)
            await trio.sleep(0.1)
        nursery.start_soon(call, 5)  # a fifth waits for one of them to end
        await trio.sleep(1.0)
        assert answered == {} and batches == [[-1], [-2], [-3], [-4]]
        release.set()
        await trio.sleep(1.0)
        for n in (6, 7):  # after them, calls gather again
            nursery.start_soon(call, n)
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    assert batches[4:] == [[5], [6, 7]] or sorted(batches[5]) == [6, 7]
    assert set(answered) == {-1, -2, -3, -4, 5, 6, 7}
