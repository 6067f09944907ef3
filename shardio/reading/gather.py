"""Raw batches gathered straight from decoded runs: a window's samples kept field by field.

``shardio.reading.stream`` decodes a shuffle window run by run; with columns on, each run's
samples are also filed into one column per field, indexed by the sample's rank in the
window (bytes values with their lengths, ints in a numpy array), once per run. A batch
(``Chunk.record_batch``) is then a few C-level gathers per field from those columns
(``operator.itemgetter``, numpy fancy indexing) instead of a pass over 64 sample dicts
per field: the ``RecordBatch`` (one buffer plus offsets, its pieces views of the runs
read) is built without touching a sample dict. Batches are what
``RecordBatch.from_samples`` builds from the same samples, field for field; fields come
in the order the window's runs first showed them. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import numpy.typing as npt

from shardio.format.record import INDEX_FIELD, KEY_FIELD
from shardio.format.runs import BYTES, GENERIC, INT
from shardio.reading.batch import RecordBatch
from shardio.reading.filebytes import file_bytes

if TYPE_CHECKING:
    from shardio.format.runs import Columns

IndexArray = npt.NDArray[np.int64]
_BYTES = frozenset({bytes, memoryview})


class _Column:
    """One field of a window: its values by rank, and what kind they all are."""

    def __init__(self, size: int) -> None:
        self.values: list[Any] = [None] * size
        self.present = np.zeros(size, np.bool_)
        self.lengths = np.zeros(size, np.int64)
        self.ints = np.zeros(size, np.int64)
        self.maps: list[object] = [None] * size
        """Per rank, the map its bytes value is a view of (None: unknown, a copy, or a view
        of inflated payloads)."""
        self.mapped = True
        """Whether every value filed so far is a view of a map with its place known."""
        self.starts = np.zeros(size, np.int64)
        """Per rank, where the bytes value starts in its view (in its map, if it has one)."""
        self.views: list[memoryview | None] | None = None
        """Per rank, the view (of its map, or of inflated payloads) a bytes value not cut yet
        (``values`` None) is cut from (None: every value is cut)."""
        self.kind: str | None = None
        """``bytes``, ``int`` or ``other`` over every run filed so far (None: none yet)."""

    def put(self, lo: int, column: list[Any]) -> None:
        hi = lo + len(column)
        self.values[lo:hi] = column
        if self.views is not None:
            self.views[lo:hi] = [None] * (hi - lo)
        self.mapped = False
        kinds = set(map(type, column))
        whole = type(None) not in kinds
        kinds.discard(type(None))
        self.present[lo:hi] = True if whole else [v is not None for v in column]
        if kinds and kinds <= _BYTES:
            kind = "bytes"
            self.lengths[lo:hi] = (np.fromiter(map(len, column), np.int64, hi - lo) if whole
                                   else [0 if v is None else len(v) for v in column])
        elif kinds == {int}:
            kind = "int"
            self.ints[lo:hi] = column if whole else [0 if v is None else v for v in column]
        else:
            kind = "other" if kinds else self.kind or "other"
        self.kind = kind if self.kind in (None, kind) else "other"

    def put_typed(self, lo: int, values: list[Any] | None, kind: int, array: IndexArray,
                  source: object = None, starts: IndexArray | None = None,
                  view: memoryview | None = None) -> None:
        """File values of one kind with their lengths (bytes, str) or themselves (int),
        and for bytes values that are views, where they start in ``view`` (and in the map
        ``source``; None for inflated payloads); ``values`` None: views of ``view``, cut
        when they are wanted."""
        hi = lo + len(array)
        if values is None:
            assert view is not None and starts is not None
            if self.views is None:
                self.views = [None] * len(self.values)
            self.views[lo:hi] = [view] * (hi - lo)
            self.values[lo:hi] = [None] * (hi - lo)
        else:
            self.values[lo:hi] = values
            if self.views is not None:
                self.views[lo:hi] = [None] * (hi - lo)
        self.present[lo:hi] = True
        if starts is not None:
            self.starts[lo:hi] = starts
            self.maps[lo:hi] = [source] * (hi - lo)
        if starts is None or source is None:  # copies, or views of inflated payloads
            self.mapped = False
        if kind == BYTES:
            self.lengths[lo:hi] = array
            name = "bytes"
        elif kind == INT:
            self.ints[lo:hi] = array
            name = "int"
        else:
            name = "other"
        self.kind = name if self.kind in (None, name) else "other"

    def value(self, rank: int) -> Any:
        """The value at ``rank`` (None: absent), cut from its map's view if not cut yet."""
        value = self.values[rank]
        if value is None and self.views is not None:
            view = self.views[rank]
            if view is not None:
                at = int(self.starts[rank])
                value = view[at : at + int(self.lengths[rank])]
        return value

    def take(self, ranks: list[int]) -> list[Any]:
        """The values at ``ranks`` (None where absent), views cut as ``value`` cuts them."""
        got = _take(self.values, ranks)
        views = self.views
        if views is None:
            return got
        cut = _take(views, ranks)
        at = np.asarray(ranks, np.int64)
        pairs = zip(self.starts[at].tolist(), (self.starts[at] + self.lengths[at]).tolist(),
                    strict=True)
        return [v if view is None else view[a:b]
                for v, view, (a, b) in zip(got, cut, pairs, strict=True)]


class ViewedSample(dict[str, Any]):
    """A sample dict whose bytes values are ``memoryview`` slices of the runs read."""

    def owned(self) -> dict[str, Any]:
        """A plain dict with every view copied into ``bytes`` (what a copy would give)."""
        return {k: bytes(v) if type(v) is memoryview else v for k, v in self.items()}


class WindowColumns:
    """A window's samples field by field, by rank; filled run by run as runs are decoded."""

    def __init__(self, unique: IndexArray) -> None:
        self.indices = unique
        self.keys: list[str | None] = [None] * len(unique)
        self.fields: dict[str, _Column] = {}
        self.dicts: list[dict[str, Any] | None] = [None] * len(unique)
        """Samples filed as dicts (``put``), handed out as they are."""
        self._index_list: list[int] | None = None
        self._dicts_filed = False
        """Whether any run was filed as dicts (``samples`` then asks ``dicts`` first)."""
        self.placed = False
        """Owned bytes values of mapped runs as ``FileBytes`` (a DataLoader worker's samples,
        which then cross to the main process as places in the shard files)."""

    def put(self, lo: int, samples: Sequence[dict[str, Any]]) -> None:
        """File the decoded samples of ranks ``lo..lo+len(samples)``."""
        hi = lo + len(samples)
        self.dicts[lo:hi] = samples
        self._dicts_filed = True
        self.keys[lo:hi] = [s[KEY_FIELD] for s in samples]
        names = dict.fromkeys(name for s in samples for name in s)
        names.pop(KEY_FIELD, None)
        names.pop(INDEX_FIELD, None)
        for name in names:
            column = self.fields.get(name)
            if column is None:
                column = self.fields[name] = _Column(len(self.keys))
            column.put(lo, [s.get(name) for s in samples])

    def put_columns(self, lo: int, decoded: Columns) -> None:
        """File records decoded field by field (``shardio.format.runs``) at ranks from ``lo``."""
        hi = lo + len(decoded.keys)
        self.keys[lo:hi] = decoded.keys
        starts = decoded.starts or [None] * len(decoded.names)
        views = decoded.views or [None] * len(decoded.names)
        sources = decoded.sources
        for name, kind, values, array, where, view, source in zip(
                decoded.names, decoded.kinds, decoded.values, decoded.arrays, starts, views,
                sources, strict=True):
            column = self.fields.get(name)
            if column is None:
                column = self.fields[name] = _Column(len(self.keys))
            if kind == GENERIC:  # a list with None where a record lacks the field
                assert values is not None
                column.put(lo, values)
            else:
                column.put_typed(lo, values, kind, array, source, where, view)

    def sample(self, rank: int, *, owned: bool = False) -> dict[str, Any]:
        """The sample at ``rank`` as its reader yields it: bytes values as filed (views of
        the runs read), or with ``owned`` copied into ``bytes`` (what msgpack would give)."""
        filed = self.dicts[rank]
        if filed is not None:
            return filed.owned() if owned and type(filed) is ViewedSample else filed
        out: dict[str, Any] = {} if owned else ViewedSample()
        out[KEY_FIELD] = self.keys[rank]
        placed = owned and self.placed
        for name, column in self.fields.items():
            value = column.value(rank)
            if value is not None:  # filed values are never None: None is a field absent
                if owned and type(value) is memoryview:
                    source = column.maps[rank] if placed else None
                    value = bytes(value) if source is None else file_bytes(
                        value, source, int(column.starts[rank]))
                out[name] = value
        if self._index_list is None:  # one conversion a window, not a numpy scalar a sample
            self._index_list = self.indices.tolist()
        out[INDEX_FIELD] = self._index_list[rank]
        return out

    def samples(self, ranks: list[int], *, owned: bool = False) -> list[dict[str, Any]]:
        """``[sample(rank, owned=owned) for rank in ranks]``, made field by field: each
        column's values are cut in one ``take``, and each dict is built in one call, where
        ``sample`` costs a handful of Python steps a field a sample (a plain ``DataLoader``
        asks for every sample this way)."""
        if not ranks:
            return []
        if self._dicts_filed and any(d is not None for d in _take(self.dicts, ranks)):
            return [self.sample(rank, owned=owned) for rank in ranks]
        if self._index_list is None:
            self._index_list = self.indices.tolist()
        names: list[str] = [KEY_FIELD]
        columns: list[list[Any]] = [_take(self.keys, ranks)]
        whole = True
        at = np.asarray(ranks, np.int64)
        for name, column in self.fields.items():
            values = column.take(ranks)
            whole = whole and bool(column.present[at].all())
            if owned and column.kind != "int":
                values = _owned(values, column, ranks, self.placed)
            names.append(name)
            columns.append(values)
        names.append(INDEX_FIELD)
        columns.append(_take(self._index_list, ranks))
        make: Any = dict if owned else ViewedSample
        # every list holds len(ranks) values: zip's strict check would only cost
        if whole:
            return [make(zip(names, row, strict=False)) for row in zip(*columns, strict=False)]
        # None is a field absent: left out of that sample's dict, as ``sample`` leaves it
        return [make((n, v) for n, v in zip(names, row, strict=False) if v is not None)
                for row in zip(*columns, strict=False)]


class Chunk(Sequence[dict[str, Any]]):
    """Samples of one batch, which batch themselves from their windows' columns.

    ``RecordBatch.from_samples(chunk)`` calls ``chunk.record_batch()``, which
    gathers the batch column by column; the sample dicts are made only for a
    collate that reads them.
    """

    def __init__(self) -> None:
        self.parts: list[tuple[WindowColumns, list[int]]] = []
        self._size = 0
        self._samples: list[dict[str, Any]] | None = None

    def add(self, columns: WindowColumns, ranks: list[int]) -> None:
        """Append the samples at ``ranks`` of a window."""
        self.parts.append((columns, ranks))
        self._size += len(ranks)
        self._samples = None

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self.samples()[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.samples())

    def samples(self) -> list[dict[str, Any]]:
        """The samples as dicts (made on first use)."""
        if self._samples is None:
            self._samples = [s for columns, ranks in self.parts
                             for s in columns.samples(ranks)]
        return self._samples

    def record_batch(self) -> RecordBatch:
        """The ``RecordBatch`` of these samples, gathered column by column."""
        return batch_from_columns(self.parts)


def _owned(values: list[Any], column: _Column, ranks: list[int], placed: bool) -> list[Any]:
    """``values`` with each view copied into ``bytes``, or with ``placed`` into a
    ``FileBytes`` that knows its place in its map (``WindowColumns.sample``'s copies)."""
    if not placed:
        return [bytes(v) if type(v) is memoryview else v for v in values]
    maps, starts = _take(column.maps, ranks), column.starts[ranks].tolist()
    return [v if type(v) is not memoryview else bytes(v) if source is None
            else file_bytes(v, source, start)
            for v, source, start in zip(values, maps, starts, strict=True)]


def _take(values: list[Any], ranks: list[int]) -> list[Any]:
    got = itemgetter(*ranks)(values)
    return [got] if len(ranks) == 1 else list(got)


def batch_from_columns(parts: list[tuple[WindowColumns, list[int]]]) -> RecordBatch:
    """One batch of the samples at ``ranks`` of each window's columns, in order: gathered
    field by field where the batch is one window's (``_one_window_batch``); else
    ``RecordBatch.from_samples`` of its sample dicts (a batch across two windows, or a field
    whose kind differs between runs), which is what the columns must give anyway."""
    if len(parts) == 1:
        batch = _one_window_batch(*parts[0])
        if batch is not None:
            return batch
    return RecordBatch.from_samples([s for columns, ranks in parts
                                     for s in columns.samples(ranks)])


def _one_window_batch(columns: WindowColumns, ranks: list[int]) -> RecordBatch | None:
    """``batch_from_columns`` of one window's samples from its columns, or None where a
    field's kinds differ between runs: a few numpy gathers a field, where the sample
    dicts cost a pass a field a sample (about 40 us a batch, a tenth of a tiny-record epoch)."""
    at = np.asarray(ranks, np.int64)
    pieces: list[bytes | memoryview] = []
    offsets: dict[str, IndexArray] = {}
    values: dict[str, IndexArray | list[Any]] = {}
    missing: dict[str, npt.NDArray[np.bool_]] = {}
    maps: list[object] = []
    starts: list[IndexArray] = []
    mapped, start = True, 0
    for name, column in columns.fields.items():
        present = column.present[at]
        whole = bool(present.all())
        if column.kind == "int" and whole:
            values[name] = column.ints[at]
            continue
        if not present.any():
            continue  # no sample of the batch has it
        got = column.take(ranks)
        if column.kind != "bytes":
            seen = set(map(type, got))
            if seen <= _BYTES | {type(None)} or seen == {int}:
                return None  # kinds that differ between runs: as from_samples classifies them
            values[name] = got
            continue
        field_offsets = np.empty(len(at) + 1, np.int64)
        field_offsets[0] = start
        np.cumsum(column.lengths[at], out=field_offsets[1:])
        field_offsets[1:] += start
        offsets[name] = field_offsets
        start = int(field_offsets[-1])
        if not whole:  # one (empty) piece a sample keeps pieces and offsets aligned
            missing[name] = ~present
            got = [b"" if v is None else v for v in got]
        pieces += got
        if mapped and column.mapped:
            maps += _take(column.maps, ranks)
            starts.append(column.starts[at])
        else:
            mapped = False
    batch = RecordBatch(_take(columns.keys, ranks), columns.indices[at], pieces, offsets,
                        values, missing=missing)
    if mapped and maps:
        batch.places = (maps, np.concatenate(starts))
    return batch
