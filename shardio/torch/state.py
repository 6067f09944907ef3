"""The epoch cell shared with persistent DataLoader workers. Imports torch (for shared memory).

The state-dict format and everything computed from it is torch-free, in
``shardio.order.resume``; ``merge_states`` is kept importable from here.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

import msgpack
import torch

from shardio.order.resume import merge_states

__all__ = ["SharedState", "merge_states", "pass_state"]


class SharedState:
    """A small msgpack value in shared memory, visible to persistent DataLoader workers.

    ``set_epoch`` and ``load_state_dict`` run in the main process, but
    persistent workers keep their own copy of the dataset; they read the epoch
    and pending resume from here at the start of each iteration. Every
    ``write`` starts a new *generation*; a worker that starts iterating records
    the generation it read, its worker count and the lanes of the order it
    reads, so the main process can tell that workers, not itself, consumed the
    current epoch, and in which arrangement its positions count.

    Passes: each iteration that starts counts as a pass of the generation, and
    pass ``k`` reads epoch ``epoch + k`` (``begin_pass``). A pass is counted per
    reader: worker ``j`` of ``n`` (the main process is worker 0 of 1) counts the
    passes it started, in a slot only it writes, so the workers of one pass agree
    on it without a lock, whether they persist between passes or are new each time.
    """

    CAPACITY = 1 << 20
    MAX_PASS_WORKERS = 128
    """Workers per DataLoader whose passes are counted: a slot each for every worker
    count up to this (8,256 slots, 132 KB)."""

    def __init__(self) -> None:
        """Private memory until a worker can see it (``share``): moving the cell to shared
        memory took 5 to 15 ms, a fifth of a warm epoch of 10^4 tiny samples read in one
        process, which never needs it (cProfile of that epoch, ``_share_fd_cpu_``)."""
        self._buf = torch.zeros(self.CAPACITY, dtype=torch.uint8)
        # [generation workers last read, their num_workers, lanes, batch]; -1: none yet
        self._workers = torch.full((4,), -1, dtype=torch.int64)
        # per (num_workers, worker): [generation, passes it started in it]; one row per
        # worker count, so that loaders of different worker counts never mix their counts
        slots = self.MAX_PASS_WORKERS * (self.MAX_PASS_WORKERS + 1) // 2
        self._passes = torch.full((slots, 2), -1, dtype=torch.int64)
        # [generation, pass] of the pass started last (its readers all write the same values)
        self._last = torch.full((2,), -1, dtype=torch.int64)
        self._generation = 0
        self.write({"epoch": 0, "resume": None})
        _PRIVATE.add(self)

    def share(self) -> None:
        """Move the cell to shared memory (in place: the values stay), before a process that
        reads it is forked or unpickled; at most once."""
        for tensor in (self._buf, self._workers, self._passes, self._last):
            tensor.share_memory_()  # type: ignore[no-untyped-call]
        _PRIVATE.discard(self)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for a ``spawn``/``forkserver`` worker: shared first, so that the worker's
        copy and this one are the same memory."""
        self.share()
        return dict(self.__dict__)

    def write(self, value: Mapping[str, Any]) -> None:
        """Publish ``value`` (epoch and resume) as a new generation."""
        self._generation += 1
        data = msgpack.packb({**value, "generation": self._generation}, use_bin_type=True)
        if len(data) + 4 > self.CAPACITY:
            raise ValueError(f"resume state of {len(data)} bytes is too large to share")
        header = len(data).to_bytes(4, "little")
        self._buf[: len(data) + 4] = torch.frombuffer(bytearray(header + data), dtype=torch.uint8)

    def read(self) -> dict[str, Any]:
        """The current value, with its ``generation``."""
        size = int.from_bytes(self._buf[:4].numpy().tobytes(), "little")
        return dict(
            msgpack.unpackb(
                self._buf[4 : 4 + size].numpy().tobytes(), raw=False, strict_map_key=False
            )
        )

    def mark_workers(
        self, generation: int, num_workers: int, lanes: int = 1, batch: int = 1
    ) -> None:
        """Called in a DataLoader worker that starts reading ``generation`` (in ``lanes``)."""
        self._workers[1] = num_workers
        self._workers[2] = lanes
        self._workers[3] = batch
        self._workers[0] = generation

    def begin_pass(self, generation: int, worker: int, num_workers: int) -> int | None:
        """Count a pass that worker ``worker`` of ``num_workers`` starts in ``generation``.

        Returns:
            The passes this reader started in ``generation`` before (so 0 for the first);
            None for more than ``MAX_PASS_WORKERS`` workers, whose passes are not counted.
        """
        if num_workers > self.MAX_PASS_WORKERS:
            return None
        slot = self._passes[num_workers * (num_workers - 1) // 2 + worker]
        done = int(slot[1]) if int(slot[0]) == generation else 0
        slot[0], slot[1] = generation, done + 1
        self._last[1] = done
        self._last[0] = generation
        return done

    def last_pass(self, generation: int) -> int | None:
        """The pass started last in ``generation`` (0: its first), or None if none started."""
        if int(self._last[0]) != generation:
            return None
        return int(self._last[1])

    def workers_read(self, generation: int) -> int:
        """How many DataLoader workers read ``generation`` (0: none did)."""
        if int(self._workers[0]) != generation:
            return 0
        return int(self._workers[1])

    def lanes_read(self, generation: int) -> tuple[int, int] | None:
        """``(lanes, batch)`` of the order DataLoader workers read in ``generation``, if any did."""
        if int(self._workers[0]) != generation:
            return None
        return int(self._workers[2]), int(self._workers[3])


_PRIVATE: weakref.WeakSet[SharedState] = weakref.WeakSet()
"""Cells not shared yet: shared before this process forks (a DataLoader's workers)."""


def _share_before_fork() -> None:
    for state in list(_PRIVATE):
        state.share()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_share_before_fork)


def pass_state(shared: Mapping[str, Any], done: int) -> dict[str, Any]:
    """``shared`` as the pass after ``done`` others of its generation reads it: the next
    epochs in turn, from their start (a pending resume is the first pass's)."""
    if done == 0:
        return dict(shared)
    return {**shared, "epoch": int(shared["epoch"]) + done, "resume": None}
