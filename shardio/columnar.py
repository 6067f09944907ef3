"""Runs of one shard decoded together, field by field: checked, inflated, parsed at once.

``record.decode_run`` decodes one run record by record. A window of a local
``.rec`` shard is read whole anyway (its runs are views of one map, checked on
the checker thread), and so is one whose remote ranges the node cache held when it
was planned (views of each range's map), so the stream decodes all of a shard's runs
in a window in one pass here: frame headers checked per run, payloads inflated where their
codec says so, and every record's map parsed by ``shardio.runfields`` in a few
numpy operations per field, with each record's ``__key__`` compared with the
shard's key block in one comparison. What comes back is one list of values per
field (views of the map for uncompressed bytes, of the inflated payloads, in a buffer of
``shardio.inflatepool``, otherwise), the samples' keys, and lengths or ints as arrays: what
``runbatch.WindowColumns`` files. Anything ``runfields`` leaves alone, or any
key that does not match, makes it return None and the caller decodes those runs
with ``decode_run``, which names what is wrong. Where a window holds several shards,
``shardio.windowdecode`` first tries all of them in one pass, and leaves to this module
the shards it cannot read so. Torch-free.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from shardio import inflatepool
from shardio.codecs import decompressor
from shardio.format import FRAME_SIZE, RunBytes, check_frames, frame_codecs
from shardio.record import INDEX_FIELD, KEY_FIELD
from shardio.runfields import BYTES, INT, STR, Column, parse_flat_maps

IndexArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RunPart:
    """One run to decode: its bytes, first record, wanted positions (None: all), and
    whether its checksums already passed (on the checker thread)."""

    run: RunBytes
    start: int
    only: list[int] | None
    checked: bool
    inflated: tuple[Sequence[Any], IndexArray] | None = None
    """The wanted records' payloads inflated, as buffers, with their lengths (the checker
    thread's ``inflate_payloads``)."""


@dataclass
class Columns:
    """Records decoded field by field, in the order of the parts and their positions."""

    keys: list[str]
    names: list[str]
    """Fields other than ``__key__``, in their order in the records."""
    kinds: list[int]
    values: list[list[Any] | None]
    """Per field: its values (None: bytes values not cut yet, see ``views``)."""
    arrays: list[IndexArray]
    """Per field: its lengths (bytes, str) or its values (int)."""
    source: object = None
    """The map the bytes values are views of (None: views of inflated payloads)."""
    starts: list[IndexArray | None] = field(default_factory=list)
    """Per field: where each bytes value starts in its view (None: not a bytes field); in
    ``source`` too where there is one, so that a worker hands a batch over as places in
    the file without asking each view."""
    views: list[memoryview | None] = field(default_factory=list)
    """Per field: the view (of ``source``, or of the inflated payloads) its bytes values
    are cut from when they are wanted (``values`` None), a batch at a time. Cut when the
    window was decoded, they lived as long as the window and reached the garbage
    collector's oldest generation, whose full collection (about 90 ms with torch
    imported) then came every few epochs."""
    buffers: list[io.BytesIO] = field(default_factory=list)
    """The ``shardio.inflatepool`` buffers the inflated payloads are in, to give back when
    nothing is cut from them any more (the window closed)."""


def decode_columns(parts: Sequence[RunPart], *, path: str, keys: Sequence[str], verify: bool,
                   offset_of: Callable[[int], int]) -> Columns | None:
    """Check the runs' frames (raising what ``check_frames`` raises) and decode them by field.

    Returns None where the records are not all flat maps of one shape with the
    keys of ``keys`` (the shard's key block): ``decode_run`` decodes those.
    """
    for part in parts:  # checksums not checked on the checker thread: checked here
        if verify and not part.checked:
            check_frames(part.run, path=path, first_record=part.start, offset_of=offset_of)
    base = parts[0].run.buffer.obj
    at = buffer_positions(parts, base)
    codecs = None if at is None else _frame_codecs(parts, base, at)
    if codecs is None:  # a damaged header, or not one map: found and named run by run
        codecs = [np.asarray(check_frames(part.run, path=path, first_record=part.start,
                                          verify=False, offset_of=offset_of), np.uint8)
                  for part in parts]
    positions = [np.arange(len(part.run.bounds) - 1) if part.only is None
                 else np.asarray(part.only, np.int64) for part in parts]
    mapped = at is not None and not any(bool(c.any()) for c in codecs)
    if mapped:  # every payload is a slice of one map: parse it in place
        assert at is not None
        data: Any = memoryview(base)
        starts = np.concatenate([a + part.run.bounds[pos] + FRAME_SIZE
                                 for a, part, pos in zip(at, parts, positions, strict=True)])
        ends = np.concatenate([a + part.run.bounds[pos + 1]
                               for a, part, pos in zip(at, parts, positions, strict=True)])
        pooled: list[io.BytesIO] = []
    else:
        data, starts, ends, held = inflated_payloads(parts)
        if data is None:
            return None
        pooled = [held] if held is not None else []
    out = _columns(data, starts, ends, expected_keys(keys, parts, positions),
                   base if mapped else None)
    if out is None:
        del data  # its view, so that the buffer is free to fill again
        inflatepool.give_back(pooled)
        return None
    out.buffers = pooled
    return out


def _columns(data: Any, starts: IndexArray, ends: IndexArray, expected: list[str],
             source: object) -> Columns | None:
    """``decode_columns`` of payloads ``data[starts[i]:ends[i]]`` (views of the map
    ``source``, or inflated: None)."""
    arr = np.frombuffer(data, np.uint8)
    maps = parse_flat_maps(arr, starts, ends)
    if maps is None or KEY_FIELD not in maps.names or INDEX_FIELD in maps.names:
        return None
    key_column = maps.columns[maps.names.index(KEY_FIELD)]
    if key_column.kind != STR or not _same_keys(arr, key_column, expected):
        return None
    out = Columns(expected, [], [], [], [], source=source)
    try:
        for name, column in zip(maps.names, maps.columns, strict=True):
            if name != KEY_FIELD:
                file_column(out, name, column, data)
    except UnicodeDecodeError:  # a str field that is not UTF-8: decode_run names the record
        return None
    return out


def buffer_positions(parts: Sequence[RunPart], base: object) -> list[int] | None:
    """Where each part's buffer starts in ``base``, the map they are all views of (None:
    they are not). Measured from the buffers' addresses, not taken from ``run.offset``
    (the offset in the shard file): a remote run is a view of a cached range's map, which
    starts where the range does."""
    if not all(part.run.buffer.obj is base and part.run.offset >= 0 for part in parts):
        return None
    origin = np.frombuffer(base, np.uint8).ctypes.data  # type: ignore[call-overload]
    at = [np.frombuffer(part.run.buffer, np.uint8).ctypes.data - origin for part in parts]
    return at


def _frame_codecs(parts: Sequence[RunPart], base: object, at: list[int]
                  ) -> list[npt.NDArray[np.uint8]] | None:
    """Every frame header of the parts checked in one pass over their map, the parts
    starting at ``at`` in it (None: one failed)."""
    if len({part.run.checksum for part in parts}) != 1:
        return None
    starts = np.concatenate([a + part.run.bounds[:-1] for a, part in zip(at, parts, strict=True)])
    sizes = np.concatenate([np.diff(part.run.bounds) for part in parts])
    data = np.frombuffer(base, np.uint8)  # type: ignore[call-overload]
    codecs = frame_codecs(data, starts, sizes, parts[0].run.checksum)
    if codecs is None:
        return None
    cuts = np.cumsum([len(part.run.bounds) - 1 for part in parts])[:-1]
    return list(np.split(codecs, cuts))


def inflated_payloads(parts: Sequence[RunPart], pad: int = 0
                      ) -> tuple[memoryview | None, IndexArray, IndexArray, io.BytesIO | None]:
    """The wanted payloads, inflated where compressed, back to back in one buffer of
    ``shardio.inflatepool`` (one copy of every part's buffers), with ``pad`` zero bytes
    before and after them: a view of them, where each starts and ends in it, and the
    buffer to give back once nothing is cut from it any more."""
    pieces: list[Sequence[Any]] = []
    sizes: list[IndexArray] = []
    for part in parts:
        # the checker thread's, or inflated here
        got = part.inflated or inflate_payloads(part.run, part.only)
        if got is None:  # a frame that does not inflate: decode_run names it
            empty = np.empty(0, np.int64)
            return None, empty, empty, None
        pieces.append(got[0])
        sizes.append(got[1])
    lengths = np.concatenate(sizes)
    stops = np.cumsum(lengths) + pad
    padding = [bytes(pad)] if pad else []
    view, held = inflatepool.joined(
        itertools.chain(padding, itertools.chain.from_iterable(pieces), padding))
    return view, stops - lengths, stops, held


def compressed(run: RunBytes, only: list[int] | None) -> bool:
    """Whether any of the run's records (of them, those at positions ``only``) is compressed."""
    firsts = run.bounds[:-1] if only is None else run.bounds[np.asarray(only, np.int64)]
    return len(firsts) > 0 and bool(np.frombuffer(run.buffer, np.uint8)[firsts + 8].any())


def inflate_payloads(run: RunBytes, only: list[int] | None
                     ) -> tuple[Sequence[Any], IndexArray] | None:
    """The run's payloads (of them, those at positions ``only``), inflated where their codec
    byte says so, as a sequence of buffers, and their lengths; None if one does not inflate.

    A run of compressed records is inflated by one zstd call (in C, without the GIL, so
    the checker thread runs it beside the reader); record by record otherwise. The
    buffers are joined once, with every other run of the shard's window
    (``inflated_payloads``): joined here, on the checker thread, the copy held the GIL
    the reader waits for.
    """
    bounds = run.bounds
    wanted = None if only is None else np.asarray(only, np.int64)
    firsts = bounds[:-1] if wanted is None else bounds[wanted]
    lo = firsts + FRAME_SIZE
    hi = bounds[1:] if wanted is None else bounds[wanted + 1]
    heads = np.frombuffer(run.buffer, np.uint8)[firsts + 8]
    dctx = decompressor()
    buf = run.buffer
    if len(lo) and bool(heads.all()):
        try:
            segments = np.column_stack((lo, hi - lo)).astype(np.uint64)
            out: Any = dctx.multi_decompress_to_buffer(  # iterates its segments (buffers)
                zstandard.BufferWithSegments(buf, segments.tobytes()), threads=0)
            return out, np.fromiter(map(len, out), np.int64, len(lo))
        except Exception:  # a frame without its size, or a bad one: record by record below
            pass
    inflate = dctx.decompress
    try:
        pieces = [inflate(buf[a:b]) if c else buf[a:b]
                  for a, b, c in zip(lo.tolist(), hi.tolist(), heads.tolist(), strict=True)]
    except Exception:  # zstd raises several types on a bad frame
        return None
    return pieces, np.fromiter(map(len, pieces), np.int64, len(pieces))


def expected_keys(keys: Sequence[str], parts: Sequence[RunPart],
                  positions: list[IndexArray]) -> list[str]:
    """The keys of the parts' wanted records (``positions`` in each), from the key block."""
    out: list[str] = []
    for part, pos in zip(parts, positions, strict=True):
        if part.only is None:
            out += keys[part.start : part.start + len(pos)]
        else:
            out += [keys[part.start + p] for p in part.only]
    return out


def _same_keys(arr: npt.NDArray[np.uint8], column: Column, expected: list[str]) -> bool:
    """Whether each record's ``__key__`` bytes are those of its key in the key block."""
    assert column.starts is not None and column.ends is not None
    joined = "".join(expected)
    if not joined.isascii():  # lengths in characters are not lengths in bytes
        return False
    lengths = np.fromiter(map(len, expected), np.int64, len(expected))
    if not np.array_equal(column.ends - column.starts, lengths):
        return False
    total = int(lengths.sum())
    firsts = np.cumsum(lengths) - lengths
    where = np.repeat(column.starts - firsts, lengths) + np.arange(total)
    return bool(np.array_equal(arr[where], np.frombuffer(joined.encode("ascii"), np.uint8)))


def file_column(out: Columns, name: str, column: Column, data: Any) -> None:
    """Append one field of the records to ``out``: bytes values as views of ``data`` (a
    map, or inflated payloads) cut when wanted, strs decoded, ints; their lengths or
    ints, and where each bytes value starts in ``data``."""
    out.names.append(name)
    out.kinds.append(column.kind)
    viewed = column.kind == BYTES
    out.starts.append(column.starts if viewed else None)
    out.views.append(memoryview(data) if viewed else None)
    if column.kind == INT:
        assert column.ints is not None
        out.values.append(column.ints.tolist())
        out.arrays.append(column.ints)
        return
    assert column.starts is not None and column.ends is not None
    if viewed:  # cut a batch at a time (``runbatch._Column.take``), see ``Columns.views``
        out.values.append(None)
    else:
        pairs = zip(column.starts.tolist(), column.ends.tolist(), strict=True)
        out.values.append([str(data[a:b], "utf-8") for a, b in pairs])
    out.arrays.append(column.ends - column.starts)
