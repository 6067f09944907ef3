"""Resumable reader state: the shared epoch/resume cell and the state-dict format.

A ``state_dict`` is plain msgpack/JSON-friendly data (``progress_to_state``):
``{"shardio": 1, "seed", "epoch", "world_size", "num_workers", "consumed":
{rank: [samples per worker]}, "prior"}``, where ``prior`` is the state an
epoch was itself resumed from under another split (see ``shardio.plan``).
``SharedState`` carries the epoch and a pending resume from the main process
to persistent DataLoader workers. Imports torch (for shared memory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import torch

from shardio.plan import Progress


class SharedState:
    """A small msgpack value in shared memory, visible to persistent DataLoader workers.

    ``set_epoch`` and ``load_state_dict`` run in the main process, but
    persistent workers keep their own copy of the dataset; they read the epoch
    and pending resume from here at the start of each iteration.
    """

    CAPACITY = 1 << 20

    def __init__(self) -> None:
        self._buf = torch.zeros(self.CAPACITY, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
        self.write({"epoch": 0, "resume": None})

    def write(self, value: Mapping[str, Any]) -> None:
        data = msgpack.packb(value, use_bin_type=True)
        if len(data) + 4 > self.CAPACITY:
            raise ValueError(f"resume state of {len(data)} bytes is too large to share")
        header = len(data).to_bytes(4, "little")
        self._buf[: len(data) + 4] = torch.frombuffer(bytearray(header + data), dtype=torch.uint8)

    def read(self) -> dict[str, Any]:
        size = int.from_bytes(self._buf[:4].numpy().tobytes(), "little")
        return dict(
            msgpack.unpackb(
                self._buf[4 : 4 + size].numpy().tobytes(), raw=False, strict_map_key=False
            )
        )


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


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the per-rank ``state_dict()`` of every rank, to resume under another world size."""
    if not states:
        raise ValueError("no states to merge")
    merged = dict(states[0])
    consumed: dict[str, list[int]] = {}
    for state in states:
        if (state["epoch"], state["world_size"], state["num_workers"]) != (
            merged["epoch"],
            merged["world_size"],
            merged["num_workers"],
        ):
            raise ValueError("states come from different epochs or splits")
        consumed.update(state["consumed"])
    merged["consumed"] = consumed
    return merged
