"""What training does with a sample whose image does not decode: raise, or skip and count.

``StreamingDataset(on_bad_image="raise")`` (the default) lets the ``DecodeError`` naming
the sample end the epoch. ``"skip"`` leaves the sample out and counts it in a
``SkippedImages`` shared with the DataLoader workers (each process writes a slot of
its own, so no lock is needed), and the process that sees an epoch end warns with
the count and the first keys (``BadImageWarning``): the epoch holds fewer samples than
``len(dataset)``, and says so. Imports torch (for the shared memory).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.data import get_worker_info

OnBadImage = Literal["raise", "skip"]
SLOTS = 256
"""Processes counted apart: this one (slot 0) and DataLoader workers by id (beyond 255
workers two share a slot, and an increment may be lost)."""
KEYS_KEPT = 5
"""Keys of skipped samples kept per process, for the warning and ``Skipped.keys``."""
_KEY_BYTES = 200
_SLOT_BYTES = KEYS_KEPT * (2 + _KEY_BYTES)


class BadImageWarning(UserWarning):
    """An epoch skipped samples whose images do not decode (``on_bad_image="skip"``)."""


@dataclass(frozen=True)
class Skipped:
    """Samples skipped since the dataset was made, over all its processes."""

    count: int
    keys: tuple[str, ...]
    """The keys of the first few (``KEYS_KEPT`` per process), for a look at them."""


def check_on_bad_image(value: str) -> OnBadImage:
    """``value`` if it is ``"raise"`` or ``"skip"``.

    Raises:
        ValueError: anything else.
    """
    if value not in ("raise", "skip"):
        raise ValueError(f"on_bad_image must be 'raise' or 'skip', got {value!r}")
    return "skip" if value == "skip" else "raise"


class SkippedImages:
    """The count and first keys of skipped samples, in memory shared with DataLoader workers.

    Made in the main process with the dataset (fork and spawn workers get it with the
    dataset); counts only grow, so a process's epoch count is its difference.
    """

    def __init__(self) -> None:
        self._counts = torch.zeros(SLOTS, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._num_keys = torch.zeros(SLOTS, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._keys = torch.zeros((SLOTS, _SLOT_BYTES), dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]

    @staticmethod
    def _slot() -> int:
        info = get_worker_info()
        return 0 if info is None else 1 + info.id % (SLOTS - 1)

    def record(self, key: str | None) -> None:
        """Count one skipped sample of this process; keep its key if it is among the first."""
        slot = self._slot()
        kept = int(self._num_keys[slot])
        if kept < KEYS_KEPT:
            data = str(key).encode("utf-8")[:_KEY_BYTES]
            at = kept * (2 + _KEY_BYTES)
            entry = len(data).to_bytes(2, "little") + data
            self._keys[slot, at : at + len(entry)] = torch.frombuffer(bytearray(entry),
                                                                      dtype=torch.uint8)
            self._num_keys[slot] = kept + 1  # after the entry: a reader never sees half a key
        self._counts[slot] += 1

    def mine(self) -> int:
        """Samples this process skipped."""
        return int(self._counts[self._slot()])

    def read(self) -> Skipped:
        """The count over every process, and the first keys kept."""
        keys: list[str] = []
        for slot in torch.nonzero(self._num_keys).flatten().tolist():
            row = self._keys[slot].numpy().tobytes()
            for k in range(int(self._num_keys[slot])):
                at = k * (2 + _KEY_BYTES)
                size = int.from_bytes(row[at : at + 2], "little")
                keys.append(row[at + 2 : at + 2 + size].decode("utf-8", "replace"))
        return Skipped(int(self._counts.sum()), tuple(keys[:KEYS_KEPT]))

    def warn(self, path: str, epoch: int, count: int) -> None:
        """Warn that ``count`` samples of ``epoch`` were skipped (nothing when none were)."""
        if count <= 0:
            return
        keys = ", ".join(map(repr, self.read().keys))
        warnings.warn(
            f"{path}: epoch {epoch} skipped {count} sample(s) whose images do not decode "
            f"(on_bad_image='skip'), e.g. {keys}; dataset.skipped_images counts them all. "
            "Inspect them with decode='raw', or run `shardio verify --images`",
            BadImageWarning, stacklevel=3)
