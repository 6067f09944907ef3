"""``RecordBatch``: a batch of raw samples as a few contiguous tensors.

A DataLoader worker that hands over a list of 64 bytes objects pays for
pickling each of them; a ``RecordBatch`` carries every bytes field of the
batch as one uint8 tensor plus an offsets tensor (moved through shared memory
as one block), integer fields as one int64 tensor, and only the keys and any
other small values as plain lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from shardio.record import INDEX_FIELD, KEY_FIELD


class RecordBatch:
    """Raw samples of one batch, field by field.

    ``batch.bytes("image")`` gives zero-copy memoryviews, one per sample;
    ``batch["label"]`` a tensor for integer fields (a list otherwise);
    ``batch.sample(i)`` or iteration rebuilds the sample dicts.
    """

    def __init__(
        self,
        keys: list[str],
        indices: torch.Tensor,
        blobs: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        values: Mapping[str, torch.Tensor | list[Any]],
    ) -> None:
        self.keys = keys
        self.indices = indices
        self.blobs = dict(blobs)
        self.values = dict(values)

    @classmethod
    def from_samples(cls, samples: Sequence[Mapping[str, Any]]) -> RecordBatch:
        """Gather sample dicts (as the reader yields them) into one batch."""
        keys = [s[KEY_FIELD] for s in samples]
        indices = torch.tensor([s.get(INDEX_FIELD, -1) for s in samples], dtype=torch.int64)
        names = [n for n in samples[0] if n not in (KEY_FIELD, INDEX_FIELD)] if samples else []
        blobs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        values: dict[str, torch.Tensor | list[Any]] = {}
        for name in names:
            column = [s.get(name) for s in samples]
            if all(isinstance(v, bytes) for v in column):
                lengths = np.fromiter((len(v) for v in column), np.int64, len(column))
                offsets = np.zeros(len(column) + 1, np.int64)
                np.cumsum(lengths, out=offsets[1:])
                data = torch.frombuffer(bytearray(b"".join(column)), dtype=torch.uint8) if (
                    offsets[-1]
                ) else torch.zeros(0, dtype=torch.uint8)
                blobs[name] = (data, torch.from_numpy(offsets))
            elif all(type(v) is int for v in column):
                values[name] = torch.tensor(column, dtype=torch.int64)
            else:
                values[name] = column
        return cls(keys, indices, blobs, values)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def fields(self) -> list[str]:
        """Field names of the samples, ``__key__`` and ``__index__`` left out."""
        return [*self.blobs, *self.values]

    @property
    def labels(self) -> torch.Tensor | None:
        """The ``label`` field of an ImageFolder pack, as int64, or None."""
        label = self.values.get("label")
        return label if isinstance(label, torch.Tensor) else None

    @property
    def nbytes(self) -> int:
        """Bytes held in the batch's bytes fields."""
        return sum(int(data.numel()) for data, _ in self.blobs.values())

    def bytes(self, field: str) -> list[memoryview]:
        """One zero-copy view per sample of bytes field ``field``."""
        data, offsets = self.blobs[field]
        view = memoryview(data.numpy()).cast("B")
        offs = offsets.tolist()
        return [view[offs[i] : offs[i + 1]] for i in range(len(offs) - 1)]

    def __getitem__(self, field: str) -> torch.Tensor | list[Any] | list[memoryview]:
        if field in self.blobs:
            return self.bytes(field)
        return self.values[field]

    def sample(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as a dict, bytes fields copied out of the batch buffer."""
        out: dict[str, Any] = {KEY_FIELD: self.keys[i], INDEX_FIELD: int(self.indices[i])}
        for name, (data, offsets) in self.blobs.items():
            out[name] = data[int(offsets[i]) : int(offsets[i + 1])].numpy().tobytes()
        for name, column in self.values.items():
            value = column[i]
            out[name] = int(value) if isinstance(column, torch.Tensor) else value
        return out

    def __iter__(self) -> Any:
        return (self.sample(i) for i in range(len(self)))

    def pin_memory(self) -> RecordBatch:
        """Page-locked copy, for the DataLoader's ``pin_memory`` thread."""
        return self.to("pin")

    def to(self, device: str | torch.device, non_blocking: bool = False) -> RecordBatch:
        """The batch with its tensors on ``device`` (``"pin"``: pinned host memory)."""
        def move(t: torch.Tensor) -> torch.Tensor:
            if device == "pin":
                return t.pin_memory()
            return t.to(device, non_blocking=non_blocking)

        return RecordBatch(
            self.keys,
            move(self.indices),
            {n: (move(d), o) for n, (d, o) in self.blobs.items()},
            {n: move(v) if isinstance(v, torch.Tensor) else v for n, v in self.values.items()},
        )

    def __repr__(self) -> str:
        return f"RecordBatch({len(self)} samples, fields={self.fields}, {self.nbytes} bytes)"
