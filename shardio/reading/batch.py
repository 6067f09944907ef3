"""``RecordBatch``: a batch of raw samples as one contiguous buffer plus offsets.

A DataLoader worker hands its batch to the main process by pickling it. A
list of 64 bytes objects costs 64 pickled objects; a batch of tensors costs a
shared-memory segment and a file-descriptor transfer *per tensor* (about a
millisecond each on a small machine, measured in ``benchmarks/``). A
``RecordBatch`` is one ``bytes`` buffer holding every bytes field of every
sample back to back, small numpy arrays of offsets, indices and integer
fields, and the keys: a handful of objects however large the batch. Through
``shardio.loader`` with workers it does not even cross as that: the worker
writes it into shared memory it reuses (``write_shared``, ``shardio.torch.handover.ring``)
and the main process wraps the same bytes (``from_shared``) without copying
them. Torch is imported only to hand out tensors on request.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shardio.format.record import INDEX_FIELD, KEY_FIELD

if TYPE_CHECKING:
    import torch

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
UInt8Array = npt.NDArray[np.uint8]
SharedLayout = tuple[Any, ...]
"""Where ``write_shared`` put each part of a batch, relative to its start (see there)."""
_ALIGN = 8


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class RecordBatch:
    """Raw samples of one batch, field by field.

    ``batch.bytes("image")`` gives zero-copy memoryviews, one per sample;
    ``batch.labels`` the ``label`` field as an int64 tensor; ``batch["n"]`` an
    int field as a numpy array (other values as lists); ``batch.sample(i)`` or
    iteration rebuilds the sample dicts. Fields are the union over the
    samples; where a sample lacks one, all three give None. A batch that
    came from a worker's shared memory (``from_shared``) gives read-only views
    of that memory, which stays valid as long as any of them is held.
    """

    def __init__(
        self,
        keys: list[str] | None,
        indices: Int64Array,
        buffer: bytes | memoryview | Sequence[bytes | memoryview],
        offsets: Mapping[str, Int64Array],
        values: Mapping[str, Int64Array | list[Any]],
        *,
        missing: Mapping[str, BoolArray] | None = None,
    ) -> None:
        """Wrap a batch; ``buffer`` may still be the per-sample pieces (joined on demand).

        In the process that read the samples the pieces are views of the blocks
        read from disk, and a consumer there reads them without any copy; the
        batch is joined into one ``bytes`` only when it is pickled to cross to
        another process, or when ``buffer`` is asked for.

        Args:
            keys: each sample's ``__key__`` (None: ``from_shared`` sets them).
            indices: each sample's ``__index__`` (-1 where unknown).
            buffer: the bytes fields, field by field, sample by sample: whole
                (``bytes``, or a ``memoryview`` of shared memory) or in pieces.
            offsets: per bytes field, ``len(keys) + 1`` offsets into ``buffer``.
            values: the other fields, one column each.
            missing: per bytes field that some samples lack, True where the
                sample lacks it (its slice of ``buffer`` is empty).
        """
        self._keys: list[str] | None = keys
        self._key_blob: tuple[str, Int64Array] | None = None
        """Keys not split yet: joined, and their ends (in characters)."""
        self.indices = indices
        self._buffer: bytes | memoryview | None = None
        self._pieces: list[bytes | memoryview] | None = None
        if isinstance(buffer, (bytes, memoryview)):
            self._buffer = buffer
        else:
            self._pieces = list(buffer)
        self.offsets = dict(offsets)
        self.values = dict(values)
        self.missing = dict(missing or {})
        self.places: tuple[list[object], Int64Array] | None = None
        """While the batch is in pieces, each piece's map and where in it the piece starts,
        where the reader knows them (``shardio.reading.gather``); None otherwise."""

    @property
    def keys(self) -> list[str]:
        """Each sample's ``__key__`` (split on first use in a batch from another process)."""
        if self._keys is None:
            text, ends = self._key_blob or ("", np.zeros(1, np.int64))
            self._keys = [text[a:b] for a, b in itertools.pairwise(ends.tolist())]
            self._key_blob = None
        return self._keys

    @property
    def buffer(self) -> bytes | memoryview:
        """Every bytes field of every sample, back to back (see ``offsets``).

        ``bytes``, or a read-only ``memoryview`` of shared memory for a batch
        that came from a ``shardio.loader`` worker.
        """
        if self._buffer is None:
            self._buffer = b"".join(self._pieces or ())
            self._pieces = self.places = None
        return self._buffer

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_keys"], state["_key_blob"] = self.keys, None
        state["_buffer"], state["_pieces"], state["places"] = bytes(self.buffer), None, None
        return state

    def shared_nbytes(self) -> int:
        """Bytes ``write_shared`` needs for this batch."""
        n = len(self.indices)
        words = n + (n + 1) * (len(self.offsets) + 1) + n * len(self._int_columns())
        flags = len(self.missing) * _aligned(n)
        return _aligned(self.nbytes) + 8 * words + flags + 8 * _ALIGN

    def _int_columns(self) -> list[str]:
        return [name for name, col in self.values.items() if isinstance(col, np.ndarray)]

    def write_shared(self, dst: UInt8Array, at: int = 0) -> tuple[SharedLayout, int]:
        """Copy the batch into ``dst`` from byte ``at`` on: buffer and arrays (the keys,
        joined into one ``str``, travel in the layout).

        Args:
            dst: writable bytes, at least ``at + shared_nbytes()`` long.
            at: where to start (a multiple of 8).

        Returns:
            The layout ``from_shared`` needs (small: offsets and names, plus the
            columns that are not int arrays, which travel as they are), and the
            byte after the last one written.
        """
        out = dst.data
        n = len(self.indices)
        start = at
        if self._pieces is not None:
            joined = b"".join(self._pieces)  # one C loop, then one copy: half a copy a piece
            out[at : at + len(joined)] = joined
            at += len(joined)
        else:
            size = len(self.buffer)
            out[at : at + size] = self.buffer
            at += size
        buffer_part = (start, at - start)
        at = _aligned(at)

        def put(array: npt.NDArray[Any]) -> int:
            nonlocal at
            where = at
            raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
            dst[where : where + raw.size] = raw
            at = _aligned(where + raw.size)
            return where

        indices = put(self.indices.astype(np.int64, copy=False))
        offsets = tuple((name, put(offs)) for name, offs in self.offsets.items())
        ints = tuple((name, put(np.asarray(self.values[name]))) for name in self._int_columns())
        others = {name: col for name, col in self.values.items() if not isinstance(col, np.ndarray)}
        missing = tuple((name, put(flags)) for name, flags in self.missing.items())
        keys = self.keys
        ends = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, keys), np.int64, n), out=ends[1:])
        # the keys cross joined in the layout (one str to pickle), their ends in characters
        keys_part = ("".join(keys), put(ends))
        order = tuple(name for name in self.values)
        layout = (n, buffer_part, indices, offsets, ints, others, missing, keys_part, order)
        return layout, at

    @classmethod
    def from_shared(cls, base: UInt8Array, layout: SharedLayout) -> RecordBatch:
        """The batch ``write_shared`` wrote into ``base`` (at the same offsets), without a copy.

        The arrays and views hand out ``base``'s memory; whoever owns it must
        keep it unchanged while they are held (``shardio.torch.handover.ring`` does, by
        reference counting).
        """
        n, (start, size), indices, offsets, ints, others, missing, keys_part, order = layout

        def column(at: int, count: int, dtype: type[Any]) -> Any:
            return base[at : at + count * np.dtype(dtype).itemsize].view(dtype)

        columns = {name: column(at, n, np.int64) for name, at in ints}
        values = {name: columns[name] if name in columns else others[name] for name in order}
        batch = cls(
            None,
            column(indices, n, np.int64),
            base[start : start + size].data.toreadonly(),
            {name: column(at, n + 1, np.int64) for name, at in offsets},
            values,
            missing={name: column(at, n, np.bool_) for name, at in missing},
        )
        text, ends = keys_part
        batch._key_blob = (text, column(ends, n + 1, np.int64))
        return batch

    @classmethod
    def from_samples(cls, samples: Sequence[Mapping[str, Any]]) -> RecordBatch:
        """Gather sample dicts (as the reader yields them) into one batch.

        The batch has the union of the samples' fields, in first-seen order:
        in a generic pack only some samples may have a ``.txt``, and a field
        the first sample lacks must not vanish from the others. A sample that
        lacks a field gets None there. Samples that can batch themselves (a chunk
        of ``shardio.reading.stream.iter_chunks``, filed field by field as its runs were
        decoded) do: the same batch, without a pass over the sample dicts.
        """
        build = getattr(samples, "record_batch", None)
        if build is not None:
            batch: RecordBatch = build()
            return batch
        keys = [s[KEY_FIELD] for s in samples]
        indices = np.array([s.get(INDEX_FIELD, -1) for s in samples], dtype=np.int64)
        # dict keys: an ordered set, first-seen order.
        names = list({n: None for s in samples for n in s if n not in (KEY_FIELD, INDEX_FIELD)})
        chunks: list[bytes | memoryview] = []
        offsets: dict[str, Int64Array] = {}
        values: dict[str, Int64Array | list[Any]] = {}
        missing: dict[str, BoolArray] = {}
        start = 0
        for name in names:
            column: list[Any] = [s.get(name) for s in samples]
            kinds = set(map(type, column))
            present = kinds - {type(None)}
            if present and present <= {bytes, memoryview}:
                absent = np.array([v is None for v in column], dtype=np.bool_)
                if absent.any():
                    missing[name] = absent
                    # One (empty) piece per sample keeps pieces and offsets aligned.
                    column = [b"" if v is None else v for v in column]
                field_offsets = np.zeros(len(column) + 1, np.int64)
                np.cumsum(np.array(list(map(len, column)), np.int64), out=field_offsets[1:])
                field_offsets += start
                offsets[name] = field_offsets
                chunks += column
                start = int(field_offsets[-1])
            elif kinds == {int}:
                values[name] = np.array(column, dtype=np.int64)
            else:
                values[name] = column
        return cls(keys, indices, chunks, offsets, values, missing=missing)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def fields(self) -> list[str]:
        """Field names of the samples, ``__key__`` and ``__index__`` left out."""
        return [*self.offsets, *self.values]

    @property
    def labels(self) -> torch.Tensor | None:
        """The ``label`` field of an ImageFolder pack as an int64 tensor, or None."""
        import torch

        label = self.values.get("label")
        return torch.from_numpy(label) if isinstance(label, np.ndarray) else None

    @property
    def nbytes(self) -> int:
        """Bytes held in the batch's bytes fields."""
        return max((int(offs[-1]) for offs in self.offsets.values()), default=0)

    def bytes(self, field: str) -> list[memoryview | None]:
        """One zero-copy view per sample of bytes field ``field``; None where a sample lacks it.

        A view keeps what it views alive: the shard's map for a record stored as it is,
        the window's inflated payloads of its shard for a compressed one. Keep
        ``bytes(view)`` to hold on to a sample past its batch without them.

        Raises:
            KeyError: no sample of the batch has ``field`` as bytes (a batch has the
                fields its samples have: in a generic pack, a batch may lack one).
        """
        if field not in self.offsets:
            raise KeyError(
                f"no sample of this batch has bytes field {field!r} (its bytes fields: "
                f"{list(self.offsets)}; other fields: {list(self.values)}); a batch has the "
                "fields of its samples: test `field in batch.fields` where samples differ")
        if self._pieces is not None:
            first = list(self.offsets).index(field) * len(self)
            views: list[memoryview | None] = [
                memoryview(p) for p in self._pieces[first : first + len(self)]
            ]
        else:
            offs = self.offsets[field].tolist()
            view = memoryview(self.buffer)
            views = [view[offs[i] : offs[i + 1]] for i in range(len(offs) - 1)]
        absent = self.missing.get(field)
        if absent is None:
            return views
        return [None if gone else v for v, gone in zip(views, absent.tolist(), strict=True)]

    def __getitem__(self, field: str) -> Int64Array | list[Any]:
        if field in self.offsets:
            return self.bytes(field)
        return self.values[field]

    def sample(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as a dict, bytes fields copied out of the batch buffer (None if absent)."""
        out: dict[str, Any] = {KEY_FIELD: self.keys[i], INDEX_FIELD: int(self.indices[i])}
        for name in self.offsets:
            view = self.bytes(name)[i]
            out[name] = None if view is None else view.tobytes()
        for name, column in self.values.items():
            value = column[i]
            out[name] = int(value) if isinstance(column, np.ndarray) else value
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.sample(i) for i in range(len(self)))

    def tensor(self, device: str | torch.device = "cpu", *, pin: bool = False) -> torch.Tensor:
        """The whole buffer as one uint8 tensor (e.g. for GPU JPEG decoding), on ``device``."""
        import torch

        data = torch.frombuffer(bytearray(self.buffer), dtype=torch.uint8)
        if pin:
            data = data.pin_memory()
        return data.to(device, non_blocking=pin)

    def __repr__(self) -> str:
        return f"RecordBatch({len(self)} samples, fields={self.fields}, {self.nbytes} bytes)"
