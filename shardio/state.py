"""Resumable reader state: the shared epoch/resume cell and the state-dict format.

A ``state_dict`` is plain msgpack/JSON-friendly data (``progress_to_state``):
``{"shardio": 1, "seed", "order", "epoch", "world_size", "num_workers",
"consumed": {rank: [samples per worker]}, "prior"}``, where ``order`` holds the
settings besides the seed that fix an epoch's order (``order_settings``) and
``prior`` is the state an epoch was itself resumed from under another split
(see ``shardio.plan``). ``SharedState`` carries the epoch and a pending resume
from the main process to persistent DataLoader workers, and tells the main
process whether workers have read the current epoch. Imports torch (for shared
memory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import torch

from shardio.errors import ResumeError
from shardio.plan import PlanConfig, Progress


class SharedState:
    """A small msgpack value in shared memory, visible to persistent DataLoader workers.

    ``set_epoch`` and ``load_state_dict`` run in the main process, but
    persistent workers keep their own copy of the dataset; they read the epoch
    and pending resume from here at the start of each iteration. Every
    ``write`` starts a new *generation*; a worker that starts iterating records
    the generation it read and its worker count, so the main process can tell
    that workers, not itself, consumed the current epoch.
    """

    CAPACITY = 1 << 20

    def __init__(self) -> None:
        self._buf = torch.zeros(self.CAPACITY, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
        # [generation workers last read, their num_workers]; -1: none since creation
        self._workers = torch.full((2,), -1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._generation = 0
        self.write({"epoch": 0, "resume": None})

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

    def mark_workers(self, generation: int, num_workers: int) -> None:
        """Called in a DataLoader worker that starts reading ``generation``."""
        self._workers[1] = num_workers
        self._workers[0] = generation

    def workers_read(self, generation: int) -> int:
        """How many DataLoader workers read ``generation`` (0: none did)."""
        if int(self._workers[0]) != generation:
            return 0
        return int(self._workers[1])


def order_settings(config: PlanConfig) -> dict[str, Any]:
    """What besides the seed and epoch fixes the order: two states must agree on it."""
    return {
        "num_samples": config.num_samples,
        "shuffle": config.shuffle,
        "block_size": config.block_size,
        "window": config.window,
        "drop_last": config.drop_last,
    }


def progress_to_state(progress: Progress) -> dict[str, Any]:
    """A ``Progress`` as plain msgpack/JSON-friendly data."""
    return {
        "epoch": progress.epoch,
        "world_size": progress.world_size,
        "num_workers": progress.num_workers,
        "consumed": {str(r): list(c) for r, c in progress.consumed.items()},
        "prior": None if progress.prior is None else progress_to_state(progress.prior),
    }


def progress_from_state(state: Mapping[str, Any]) -> Progress:
    """Inverse of ``progress_to_state``."""
    prior = state.get("prior")
    return Progress(
        epoch=int(state["epoch"]),
        world_size=int(state["world_size"]),
        num_workers=int(state["num_workers"]),
        consumed={int(r): tuple(int(x) for x in c) for r, c in state["consumed"].items()},
        prior=None if prior is None else progress_from_state(prior),
    )


def check_same_order(
    state: Mapping[str, Any], seed: int, order: Mapping[str, Any], *, against: str = "this dataset"
) -> None:
    """Refuse ``state`` unless it was saved with this ``seed`` and ``order_settings``.

    Raises:
        ResumeError: names every setting that differs, what the state holds and
            what ``against`` (the dataset, or the first state) has.
    """
    saved = {"seed": state.get("seed", seed), **(state.get("order") or {})}
    # a state from before the order was recorded holds only its seed: that is all we can check
    wanted = {"seed": seed, **(order if "order" in state else {})}
    differ = [name for name, value in wanted.items() if saved.get(name) != value]
    if differ:
        raise ResumeError(
            "state was saved with "
            + ", ".join(f"{name}={saved.get(name)!r}" for name in differ)
            + f"; {against} has "
            + ", ".join(f"{name}={wanted[name]!r}" for name in differ)
            + ": the resumed order would not match. Open the dataset with the seed and "
            "settings (shuffle, shuffle_buffer, block_size, drop_last) the state was saved with"
        )


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the per-rank ``state_dict()`` of every rank, to resume under another world size.

    Raises:
        ResumeError: the states disagree on seed, order settings, epoch, world
            size, worker count or the state their epoch was resumed from, or
            give one rank two different positions.
    """
    if not states:
        raise ResumeError("no states to merge: pass the state_dict() of every rank")
    first = states[0]
    merged = dict(first)
    consumed: dict[str, list[int]] = {}
    for n, state in enumerate(states):
        if ("order" in state) != ("order" in first):
            raise ResumeError(f"cannot merge: only one of states 0 and {n} records its order")
        check_same_order(state, int(first.get("seed", 0)), first.get("order") or {},
                         against="state 0")
        for name in ("epoch", "world_size", "num_workers", "prior"):
            if state.get(name) != first.get(name):
                raise ResumeError(
                    f"cannot merge: state {n} has {name}={state.get(name)!r}, state 0 has "
                    f"{first.get(name)!r}; merge the states every rank saved at the same step "
                    "of the same run"
                )
        for rank, counts in state["consumed"].items():
            if consumed.get(rank, counts) != counts:
                raise ResumeError(
                    f"cannot merge: rank {rank} appears twice with positions "
                    f"{consumed[rank]} and {counts}"
                )
            consumed[rank] = list(counts)
    merged["consumed"] = consumed
    return merged
