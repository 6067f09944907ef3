"""Many records' flat msgpack maps parsed at once, field by field, with numpy.

Most records of a pack share one shape: a flat msgpack map whose field names
come in the same order, each with values of one kind (``__key__`` a str,
``image`` a bin, ``label`` an int). Parsing such maps one by one in Python costs
about 2 us a record (``benchmarks/README.md``, "Record checksums"), as much as
the rest of a warm read. ``parse_flat_maps`` takes every record of a window's
runs in one shard at once instead: a few numpy operations per field, whatever
the number of records, so the cost per record falls with the number parsed
(numpy's fixed cost makes it slower than the loop below a few hundred records).
It gives what ``msgpack.unpackb`` gives for each record, column by column:
bytes values and strs as (start, end) offsets into the buffer, ints as an int64
array. Records of any other shape (nested values, floats, nil, bools, more than
15 fields, field names over 31 bytes, a field holding values of two kinds,
anything malformed) make it return None, and the caller parses them one by one
with msgpack, whose errors name the record, so results never differ from
msgpack's. ``parse_edges`` parses the same from each record's first and last bytes
only (``Edges``), gathered from many buffers: every shard of a window at once
(``shardio.windowdecode``). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IndexArray = npt.NDArray[np.int64]
UInt8Array = npt.NDArray[np.uint8]

INT, BYTES, STR = 1, 2, 3
"""The kinds of value a column holds."""

_KIND = np.zeros(256, np.uint8)
_KIND[0x00:0x80] = INT  # positive fixint
_KIND[0xE0:0x100] = INT  # negative fixint
_KIND[0xCC:0xD4] = INT  # uint and int of 8, 16, 32, 64 bits
_KIND[0xC4:0xC7] = BYTES  # bin 8, 16, 32
_KIND[0xA0:0xC0] = STR  # fixstr
_KIND[0xD9:0xDC] = STR  # str 8, 16, 32
_WIDTH = np.zeros(256, np.int64)
"""Bytes after the tag holding an int's value, or a bin's or str's length (0: in the tag)."""
for _tag, _width in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8), (0xD0, 1), (0xD1, 2),
                     (0xD2, 4), (0xD3, 8), (0xC4, 1), (0xC5, 2), (0xC6, 4), (0xD9, 1),
                     (0xDA, 2), (0xDB, 4)):
    _WIDTH[_tag] = _width
_SIGNED = np.zeros(256, np.bool_)
_SIGNED[0xD0:0xD4] = True


@dataclass
class Column:
    """One field of the parsed records: its kind, and its value in each record."""

    kind: int
    starts: IndexArray | None = None
    """``BYTES`` and ``STR``: where each record's value starts in the buffer."""
    ends: IndexArray | None = None
    ints: IndexArray | None = None
    """``INT``: the values."""


@dataclass
class FlatMaps:
    """The records parsed, field by field in their order in the maps."""

    names: list[str]
    columns: list[Column]


class _Flat:
    """Records that lie in one buffer: their bytes are read where they are."""

    __slots__ = ("data",)

    def __init__(self, data: UInt8Array) -> None:
        self.data = data

    def take(self, pos: IndexArray, width: int, rows: IndexArray | None = None
             ) -> UInt8Array | None:
        """Each record's ``width`` bytes from ``pos`` (``rows``: of those records only)."""
        got: UInt8Array = self.data[pos[:, None] + np.arange(width)]
        return got

    def at(self, pos: IndexArray) -> UInt8Array | None:
        return self.data[pos]


class Edges:
    """The first and last bytes of many records, which may lie in different buffers.

    What a window's records of many shards are parsed from in one pass: only their
    small fields are read, and those are near either end of a record (a key and a
    label before or after an 80 KB image), so each record's first ``heads.shape[1]``
    and last ``tails.shape[1]`` bytes are gathered shard by shard, and the parse
    reads positions counted from each record's start. A value that lies in neither
    part makes the parse return None (the caller then parses shard by shard).
    ``heads`` rows of a record shorter than their width go on past its end, and the
    ``tails`` of one shorter than theirs start before it: the parse never reads past a
    record's end, and a byte before its start never lies in neither part.
    """

    __slots__ = ("_flat_heads", "_flat_tails", "_head_rows", "_tail_rows", "heads", "lengths",
                 "tails")

    def __init__(self, heads: UInt8Array, tails: UInt8Array, lengths: IndexArray) -> None:
        self.heads, self.tails, self.lengths = heads, tails, lengths
        # read as one flat array each: a gather by flat positions is several times faster
        # than one by (row, column) pairs
        self._flat_heads = np.ascontiguousarray(heads).reshape(-1)
        self._flat_tails = np.ascontiguousarray(tails).reshape(-1)
        self._head_rows = np.arange(len(lengths)) * heads.shape[1]
        self._tail_rows = np.arange(len(lengths)) * tails.shape[1]

    def take(self, pos: IndexArray, width: int, rows: IndexArray | None = None
             ) -> UInt8Array | None:
        """Each record's ``width`` bytes from ``pos`` (``rows``: of those records only), or
        None where one lies in neither part."""
        head_width, tail_width = self.heads.shape[1], self.tails.shape[1]
        lengths = self.lengths if rows is None else self.lengths[rows]
        head_rows = self._head_rows if rows is None else self._head_rows[rows]
        span = np.arange(width)
        in_head = pos + width <= head_width
        got: UInt8Array
        if bool(in_head.all()):
            got = self._flat_heads[(head_rows + pos)[:, None] + span]
            return got
        tail_rows = self._tail_rows if rows is None else self._tail_rows[rows]
        at_tail = pos + (tail_width - lengths)
        in_tail = at_tail >= 0
        if not bool((in_head | in_tail).all()):
            return None
        if bool(in_tail.all()):
            got = self._flat_tails[(tail_rows + at_tail)[:, None] + span]
            return got
        front = self._flat_heads[(head_rows + np.minimum(pos, head_width - width))[:, None]
                                 + span]
        back = self._flat_tails[(tail_rows + np.maximum(at_tail, 0))[:, None] + span]
        out: UInt8Array = np.where(in_head[:, None], front, back)
        return out

    def at(self, pos: IndexArray) -> UInt8Array | None:
        got = self.take(pos, 1)
        return None if got is None else got[:, 0]


_Source = _Flat | Edges


def parse_flat_maps(data: UInt8Array, starts: IndexArray, ends: IndexArray) -> FlatMaps | None:
    """Parse the msgpack maps at ``data[starts[i]:ends[i]]``, all of one shape, by field.

    Returns None unless every record is a map of at most 15 fields with the same
    field names in the same order, each field holding one kind of value (int,
    bin or str) in every record, and each map ending where its record ends.
    """
    count = len(starts)
    if count == 0 or len(ends) != count or not bool((ends > starts).all()):
        return None
    if int(ends.max()) > len(data) or int(starts.min()) < 0:
        return None
    return _parse(_Flat(data), starts, ends)


def parse_edges(edges: Edges) -> FlatMaps | None:
    """``parse_flat_maps`` of records given by their ``Edges``: positions in what comes back
    count from each record's start. None also where a value lies in neither edge."""
    lengths = edges.lengths
    if len(lengths) == 0 or not bool((lengths > 0).all()):
        return None
    return _parse(edges, np.zeros(len(lengths), np.int64), lengths)


def _parse(src: _Source, starts: IndexArray, ends: IndexArray) -> FlatMaps | None:
    tags = src.at(starts)
    if tags is None:
        return None
    first = int(tags[0])
    if not 0x80 <= first <= 0x8F or not bool((tags == first).all()):
        return None
    pos = starts + 1
    names: list[str] = []
    columns: list[Column] = []
    for _ in range(first & 0x0F):
        named = _field_name(src, pos, ends)
        if named is None or named[0] in names:
            return None
        valued = _values(src, named[1], ends)
        if valued is None:
            return None
        names.append(named[0])
        columns.append(valued[0])
        pos = valued[1]
    if not bool((pos == ends).all()):
        return None
    return FlatMaps(names, columns)


def _field_name(src: _Source, pos: IndexArray, ends: IndexArray
                ) -> tuple[str, IndexArray] | None:
    """The fixstr at ``pos`` if it is one name in every record, and where its values start."""
    if not bool((pos < ends).all()):
        return None
    tags = src.at(pos)
    if tags is None:
        return None
    tag = int(tags[0])
    if not 0xA0 <= tag <= 0xBF or not bool((tags == tag).all()):
        return None
    size = tag & 0x1F
    after = pos + 1 + size
    if not bool((after < ends).all()):  # a value must follow
        return None
    rows = src.take(pos + 1, size)
    if rows is None:
        return None
    if size and not bool((rows == rows[0]).all()):
        return None
    try:
        return rows[0].tobytes().decode("utf-8"), after
    except UnicodeDecodeError:
        return None


def _values(src: _Source, pos: IndexArray, ends: IndexArray
            ) -> tuple[Column, IndexArray] | None:
    """The column of values at ``pos`` (one kind in every record) and where each ends."""
    tags = src.at(pos)
    if tags is None:
        return None
    if bool((tags == tags[0]).all()):
        return _one_tag_values(src, int(tags[0]), pos, ends)
    kinds = _KIND[tags]
    kind = int(kinds[0])
    if kind == 0 or not bool((kinds == kind).all()):
        return None
    widths = _WIDTH[tags]
    body = pos + 1
    if not bool((body + widths <= ends).all()):
        return None
    if kind == INT and not bool(widths.any()):  # fixints (labels): the values are the tags
        values = tags.astype(np.int64)
        return Column(INT, ints=np.where(values >= 0xE0, values - 0x100, values)), body
    raw = _big_endian(src, body, widths)
    if raw is None:
        return None
    if kind == INT and bool((raw >= np.uint64(1 << 63)).any()) and bool(
            (tags[raw >= np.uint64(1 << 63)] != 0xD3).any()):  # (a length is 32 bits at most)
        return None  # a uint64 above int64's range: msgpack gives a Python int, left to it
    values = raw.astype(np.int64)  # an int64's two's complement wraps to its value
    inline = widths == 0
    if kind == INT:
        if bool(inline.any()):
            fix = tags[inline].astype(np.int64)
            values[inline] = np.where(fix >= 0xE0, fix - 0x100, fix)
        signed = _SIGNED[tags] & (widths < 8)  # an int64 is right already
        if bool(signed.any()):
            top = np.left_shift(np.int64(1), widths[signed] * 8 - 1)
            v = values[signed]
            values[signed] = np.where(v >= top, v - 2 * top, v)
        return Column(INT, ints=values), body + widths
    if kind == STR and bool(inline.any()):  # fixstr: the length is in the tag
        values[inline] = tags[inline].astype(np.int64) & 0x1F
    start = body + widths
    stop = start + values
    if not bool((stop <= ends).all()):
        return None
    return Column(kind, starts=start, ends=stop), stop


def _one_tag_values(src: _Source, tag: int, pos: IndexArray, ends: IndexArray
                    ) -> tuple[Column, IndexArray] | None:
    """``_values`` where every record's value has the same tag (``bin 32`` for every image,
    ``fixstr`` keys of one length): the same checks and results with about a third of the
    numpy calls, each of which costs about a microsecond whatever its size (a window's
    records of one shard are a few dozen 80 KB images: ~2 us an image went to these
    fixed costs)."""
    kind, width = int(_KIND[tag]), int(_WIDTH[tag])
    if kind == 0:
        return None
    body = pos + 1
    after = body + width
    if not bool((after <= ends).all()):
        return None
    if width:
        got = src.take(body, width)
        if got is None:
            return None
        raw = got.view(f">u{width}").reshape(-1)
        if tag == 0xCF and bool((raw >= np.uint64(1 << 63)).any()):
            return None  # a uint64 above int64's range: msgpack gives a Python int, left to it
        values = raw.astype(np.int64)  # an int64's two's complement wraps to its value
    if kind == INT:
        if not width:  # a fixint: the value is the tag
            values = np.full(len(pos), tag - 0x100 if tag >= 0xE0 else tag, np.int64)
        elif _SIGNED[tag] and width < 8:
            top = 1 << (width * 8 - 1)
            values = np.where(values >= top, values - 2 * top, values)
        return Column(INT, ints=values), after
    if not width:  # fixstr: the length is in the tag
        values = np.full(len(pos), tag & 0x1F, np.int64)
    stop = after + values
    if not bool((stop <= ends).all()):
        return None
    return Column(kind, starts=after, ends=stop), stop


def _big_endian(src: _Source, at: IndexArray, widths: IndexArray
                ) -> npt.NDArray[np.uint64] | None:
    """Unsigned big-endian numbers of ``widths`` bytes at ``at`` (width 0: 0)."""
    out = np.zeros(len(at), np.uint64)
    present = np.bincount(widths, minlength=9).tolist()  # one call, not one per width
    for width in (1, 2, 4, 8):
        if not present[width]:
            continue
        which = np.flatnonzero(widths == width)
        got = src.take(at[which], width, which)
        if got is None:
            return None
        out[which] = got.view(f">u{width}").reshape(-1)
    return out
