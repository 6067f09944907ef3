"""The epoch cell stays in private memory until a process that reads it is forked or
unpickled, and is then one memory for both sides, whichever way the child starts."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from shardio.torch.state import SharedState


def _mark(state: SharedState, queue: Any) -> None:
    queue.put(state.read()["epoch"])
    state.mark_workers(state.read()["generation"], 3)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_reads_and_writes_the_parents_cell(method: str) -> None:
    state = SharedState()
    assert not state._buf.is_shared()  # a process that never forks pays nothing
    state.write({"epoch": 7, "resume": None})
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    child = context.Process(target=_mark, args=(state, queue))
    child.start()
    assert queue.get(timeout=60) == 7
    child.join(60)
    assert child.exitcode == 0
    assert state._buf.is_shared()
    assert state.workers_read(state.read()["generation"]) == 3  # the child's write, seen here
