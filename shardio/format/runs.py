"""A run of records of any format version → samples or columns: the one decoder.

A v3 run is whole blocks (``shardio.format.block``): each is checked once (its CRC-32C,
unless the checker thread did it), its columns inflated where stored with zstd,
and the wanted records' fields cut from them as slices computed from offsets, with
no per-record parse: ``run_columns`` returns them field by field (what
``gather.WindowColumns`` files), ``decode_run`` as sample dicts. A v1/v2 run is
one frame a record, decoded record by record by ``record.decode_run``. Torch-free.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shardio.errors import ShardCorruptError
from shardio.format import block, record
from shardio.format.block import RAW, Column, decode_columns, read_head
from shardio.format.frames import RunBytes, check_frames
from shardio.format.record import INDEX_FIELD, KEY_FIELD

IndexArray = npt.NDArray[np.int64]
INT, BYTES, STR = 1, 2, 3
"""Kinds of ``Columns`` fields: ints (``arrays`` holds them), bytes values cut from a view
when wanted, str values (the values ``runfields`` gives the same kinds)."""
GENERIC: Final = -1
"""A ``Columns`` field of any values: a list, None where a record lacks the field."""
_KINDS: Final = {block.INT: INT, block.BYTES: BYTES, block.STR: STR}


@dataclass
class Columns:
    """Records decoded field by field: one entry per field in each list."""

    keys: list[str]
    names: list[str] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    """``BYTES``, ``STR``, ``INT`` or ``GENERIC``."""
    values: list[list[Any] | None] = field(default_factory=list)
    """Per field: its values (None: bytes values not cut yet, see ``views``)."""
    arrays: list[IndexArray] = field(default_factory=list)
    """Per field: its lengths (bytes, str) or its values (int); empty for ``GENERIC``."""
    sources: list[object] = field(default_factory=list)
    """Per field: the map its bytes values are views of (None: a copy, or inflated)."""
    starts: list[IndexArray | None] = field(default_factory=list)
    """Per field: where each bytes value starts in its view (and in its source)."""
    views: list[memoryview | None] = field(default_factory=list)
    """Per field: the view its bytes values are cut from when wanted (``values`` None)."""


def run_columns(run: RunBytes, *, path: str, keys: Sequence[str], verify: bool = True,
                only: Sequence[int] | None = None) -> list[Columns]:
    """The wanted records of a v3 run, one ``Columns`` per block holding some.

    The run was read for records ``run.span`` = ``start..stop``; ``only``: ascending
    positions among them (None: all). ``keys``: the shard's key column. With
    ``verify``, each block's checksum is checked first (``check_frames``).
    """
    assert run.blocks is not None, "a v3 run"
    check_frames(run, path=path, first_record=run.span[0], verify=verify)
    start, stop = run.span
    wanted = (np.arange(start, stop, dtype=np.int64) if only is None
              else start + np.asarray(only, np.int64))
    base = run.buffer.obj
    if isinstance(base, mmap.mmap):  # bytes values as places in the map: see filebytes
        whole, shift, source = memoryview(base), _position(run.buffer, base), base
    else:
        whole, shift, source = run.buffer, 0, None
    firsts = run.blocks.tolist()
    ends = run.block_ends()
    cuts = np.searchsorted(wanted, run.blocks).tolist()
    take = getattr(keys, "take", None) or (lambda at: [keys[i] for i in at])
    out = []
    for k in range(len(firsts) - 1):
        rows = wanted[cuts[k] : cuts[k + 1]] - firsts[k]
        if len(rows) == 0:
            continue
        at = shift + int(run.bounds[k])
        buf = whole[at : shift + ends[k]]
        block = run.first_block + k
        head = read_head(buf, path=path, block=block, first_record=firsts[k],
                         num_records=firsts[k + 1] - firsts[k])
        got = Columns(take((rows + firsts[k]).tolist()))
        for entry, column in zip(head.columns, decode_columns(buf, head, path=path,
                                                              block=block), strict=True):
            raw = entry.codec == RAW
            # a raw column's data ends where its stored bytes do
            end = at + entry.at + entry.stored
            _file(got, column, rows, whole if raw else None, end, source if raw else None,
                  path, block)
        out.append(got)
    return out


def _file(out: Columns, column: Column, rows: IndexArray, whole: memoryview | None, end: int,
          source: object, path: str, block: int) -> None:
    """Add ``column``'s values at ``rows`` to ``out``; ``whole``: for a raw column, the view
    its data ends at ``end`` in (its bytes values are cut from it when wanted)."""
    out.names.append(column.name)
    out.sources.append(None)
    out.starts.append(None)
    out.views.append(None)
    if column.present is not None:  # some records lack it: a list with None for those
        present = column.present[rows].tolist()
        out.kinds.append(GENERIC)
        out.values.append([column.value(i, path=path, block=block) if p else None
                           for i, p in zip(rows.tolist(), present, strict=True)])
        out.arrays.append(np.empty(0, np.int64))
        return
    kind = _KINDS.get(column.kind, GENERIC)
    out.kinds.append(kind)
    if column.ints is not None:
        ints = column.ints[rows]
        out.values.append(ints.tolist())
        out.arrays.append(ints)
        return
    assert column.offsets is not None and column.data is not None
    if kind == GENERIC:
        out.values.append([column.value(i, path=path, block=block) for i in rows.tolist()])
        out.arrays.append(np.empty(0, np.int64))
        return
    lo, hi = column.offsets[rows], column.offsets[rows + 1]
    out.arrays.append(hi - lo)
    if kind == STR:
        data = column.data
        out.values.append([column.value(i, path=path, block=block) for i in rows.tolist()]
                          if len(rows) < 4 else _strs(data, lo.tolist(), hi.tolist(), path,
                                                      block, column.name))
        return
    out.values.append(None)  # cut a batch at a time (``gather._Column.take``)
    if whole is not None:  # raw: places in ``whole`` (and in the map, with a source)
        out.starts[-1] = lo + (end - len(column.data))
        out.views[-1] = whole
        out.sources[-1] = source
    else:  # inflated: views of the inflated column
        out.starts[-1] = lo
        out.views[-1] = column.data


def _strs(data: memoryview, lo: list[int], hi: list[int], path: str, block: int,
          name: str) -> list[str]:
    try:
        return [str(data[a:b], "utf-8") for a, b in zip(lo, hi, strict=True)]
    except UnicodeDecodeError as exc:
        raise ShardCorruptError(
            f"{path}: block {block}, column {name!r} holds a str that is not UTF-8 but passed "
            "its checksum; the shard was written by a broken writer: re-pack it", path=path,
        ) from exc


def _position(view: memoryview, base: object) -> int:
    """Where ``view`` starts in ``base``, the object it is a view of."""
    if len(view) == 0:
        return 0
    origin = np.frombuffer(base, np.uint8).ctypes.data  # type: ignore[call-overload]
    return int(np.frombuffer(view, np.uint8).ctypes.data - origin)


def decode_run(
    run: RunBytes, *, path: str, first_record: int, offset_of: Callable[[int], int] | None = None,
    verify: bool = True, first_index: int | None = None, zero_copy: bool = False,
    keys: Sequence[str] | None = None, only: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """The run's wanted records as sample dicts, each with its ``__key__`` (and, with
    ``first_index``, its global ``__index__``), whatever the shard's format version.

    v1/v2: ``record.decode_run`` (its arguments; bytes values are copies). v3: ``keys``
    (the shard's key column) is required; ``only`` as in ``run_columns``; bytes values
    are copies unless ``zero_copy``.
    """
    if run.blocks is None:
        return record.decode_run(run, path=path, first_record=first_record, offset_of=offset_of,
                                 verify=verify, first_index=first_index, keys=keys, only=only)
    assert keys is not None, "a v3 run decodes with its shard's keys"
    out: list[dict[str, Any]] = []
    for got in run_columns(run, path=path, keys=keys, verify=verify, only=only):
        out.extend(samples_of(got, copy=not zero_copy))
    if first_index is not None:
        positions = range(len(out)) if only is None else only
        for sample, n in zip(out, positions, strict=True):
            sample[INDEX_FIELD] = first_index + n
    return out


def samples_of(got: Columns, *, copy: bool = True) -> list[dict[str, Any]]:
    """``got``'s records as sample dicts (bytes values copied unless ``copy`` is False)."""
    samples: list[dict[str, Any]] = [{KEY_FIELD: key} for key in got.keys]
    for name, values, lengths, starts, view in zip(got.names, got.values, got.arrays,
                                                   got.starts, got.views, strict=True):
        if values is None:
            assert starts is not None and view is not None
            pairs = zip(starts.tolist(), (starts + lengths).tolist(), strict=True)
            values = ([bytes(view[a:b]) for a, b in pairs] if copy
                      else [view[a:b] for a, b in pairs])
        for sample, value in zip(samples, values, strict=True):
            if value is not None:
                sample[name] = value
    return samples
