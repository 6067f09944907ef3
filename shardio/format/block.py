"""Format v3 blocks: a run of consecutive records, each field a column, one CRC-32C.

A block is the unit a v3 reader reads, checks and inflates (docs/format.md, §8): the
same bytes are a stretch of a ``.rec`` shard and one LMDB value. Inside, each field
of the block's records is one *column*: bytes and str values back to back with their
offsets, ints as one fixed-width little-endian array, any other value (float, bool,
None, lists, maps, numpy arrays) msgpack-encoded per value as v2 records store it; a
field some records lack has a presence bitmap. Each column is stored raw or as one
zstd frame, whichever the rule of ``_stored`` picks, so a run of records' fields is
a set of slices computed from offsets, with no per-record parse. Keys are not in
blocks: they are the shard's key column (``shardio.format.blockfile``).

This module owns the block layout and nothing else: no file I/O; it imports from
shardio only ``errors``, ``checksum``, ``codecs`` and the msgpack value hooks of
``record``. Every count and size a block states is checked against the bytes that
hold it before anything is allocated from it (``read_head``, ``decode_columns``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgpack
import numpy as np
import numpy.typing as npt
import zstandard

from shardio.errors import ChecksumError, RecordEncodeError, ShardCorruptError
from shardio.format.checksum import CRC32C, checksum_function
from shardio.format.codecs import MIN_SAVING, decompressor, looks_compressed

# the msgpack hooks v2 records use for values (ndarrays as ext type 1), shared so both formats
# store a value alike
from shardio.format.record import INDEX_FIELD, KEY_FIELD, _check_map_keys, _default, _ext_hook

HEAD = struct.Struct("<IIQIIQ")
"""Block head: checksum, record count, first record, column count, table bytes, block bytes."""
ENTRY = struct.Struct("<BBBBQQH")
"""Column entry: kind, codec, flags, width, stored bytes, raw bytes, name length (name follows)."""
BYTES, STR, INT, MSGPACK = 0, 1, 2, 3
"""Column kinds."""
RAW, ZSTD = 0, 1
"""Column codecs: stored as is, or one zstd frame that inflates to the raw column."""
HAS_PRESENCE: Final = 1
"""Column flag: a presence bitmap starts the raw column (some records lack the field)."""
MAX_INFLATE_RATIO: Final = 1024
"""A zstd column may claim at most this many raw bytes per stored byte: the bound that keeps a
hostile block from making a reader allocate more than its size justifies. The writer stores
raw any column that would compress further (zstd itself allows about 32,768)."""
OFFSET_WIDTHS: Final = (4, 8)
INT_WIDTHS: Final = (1, 2, 4, 8)

_INT_TYPES: Final = {w: np.dtype(f"<i{w}") for w in INT_WIDTHS}
_OFFSET_TYPES: Final = {w: np.dtype(f"<u{w}") for w in OFFSET_WIDTHS}
Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class ColumnEntry(NamedTuple):
    """One column as its block's field table describes it."""

    name: str
    kind: int
    codec: int
    flags: int
    width: int
    stored: int
    raw: int
    at: int
    """Where its stored bytes start in the block."""


class BlockHead(NamedTuple):
    """A block's head and field table, checked against the block's size."""

    checksum: int
    num_records: int
    first_record: int
    columns: tuple[ColumnEntry, ...]
    size: int


class Column(NamedTuple):
    """One decoded column: value ``i`` of the block is ``data[offsets[i]:offsets[i+1]]``
    (bytes, str, msgpack) or ``ints[i]`` (int); absent where ``present`` is False."""

    name: str
    kind: int
    present: BoolArray | None
    """None: every record has the field."""
    offsets: Int64Array | None
    data: memoryview | None
    ints: Int64Array | None

    def value(self, i: int, *, path: str = "", block: int = -1) -> Any:
        """Value ``i`` as the sample held it (bytes, str, int, or the msgpack value)."""
        if self.ints is not None:
            return int(self.ints[i])
        assert self.offsets is not None and self.data is not None
        piece = self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]
        try:
            if self.kind == BYTES:
                return bytes(piece)
            if self.kind == STR:
                return str(piece, "utf-8")
            return msgpack.unpackb(piece, raw=False, ext_hook=_ext_hook, strict_map_key=True)
        except Exception as exc:  # utf-8 and msgpack raise several types; map them here
            raise ShardCorruptError(
                f"{path}: block {block}, column {self.name!r}, value {i} passed its checksum but "
                f"does not decode ({type(exc).__name__}: {exc}); the shard was written by a "
                "broken writer: re-pack it", path=path, offset=None,
            ) from exc


def encode_block(samples: Sequence[Mapping[str, Any]], *, first_record: int,
                 level: int | None) -> bytes:
    """Encode ``samples`` (consecutive records, without ``__key__``) as one block.

    Args:
        samples: one or more sample dicts; field names are str, not ``__key__`` or
            ``__index__`` (keys live in the shard's key column).
        first_record: the shard's index of ``samples[0]``, stored so that a block read
            from the wrong place is refused.
        level: zstd level for columns where compression pays; None stores every column raw.

    Raises:
        RecordEncodeError: a field name or value the format cannot store.
    """
    if not samples:
        raise ValueError("a block holds at least one record")
    names: dict[str, None] = {}
    for sample in samples:
        for name in sample:
            if not isinstance(name, str) or name in (KEY_FIELD, INDEX_FIELD):
                raise RecordEncodeError(
                    f"field name {name!r} cannot be stored in a block: names are str, and "
                    f"{KEY_FIELD} (the shard's key column) and {INDEX_FIELD} are reserved")
            names[name] = None
    table: list[bytes] = []
    # every value's bytes are copied once, into the block: joined column by column and
    # then into the block, a block of images was copied five times, which made packing
    # images 1.6 times as slow as format v2's records (8,000 JPEGs, 2 workers: 1.70 s
    # against 1.06 s; ``python -m shardio pack ... --format-version 2`` beside the default)
    segments: list[bytes] = []
    for name in names:
        values = [s.get(name, _ABSENT) for s in samples]
        kind, width, flags, parts = _column_parts(values, name)
        raw_size = sum(map(len, parts))
        if level is None or not raw_size or (kind == BYTES and _mostly_media(values)):
            codec, stored = RAW, parts
        else:
            codec, packed = store_column(kind, values, b"".join(parts), level)
            stored = [packed]
        encoded = name.encode("utf-8")
        if len(encoded) > 0xFFFF:
            raise RecordEncodeError(f"field name {name[:40]!r}... is over 65,535 UTF-8 bytes")
        table.append(ENTRY.pack(kind, codec, flags, width, sum(map(len, stored)), raw_size,
                                len(encoded)) + encoded)
        segments += stored
    size = HEAD.size + sum(map(len, table)) + sum(map(len, segments))
    head = HEAD.pack(0, len(samples), first_record, len(names), sum(map(len, table)), size)[4:]
    compute = checksum_function(CRC32C)
    crc = compute(head, 0)
    for part in (*table, *segments):
        crc = compute(part, crc)
    return b"".join([struct.pack("<I", crc), head, *table, *segments])


class _Absent:
    """Marks a field a record does not have."""


_ABSENT: Final = _Absent()


def encode_column(values: Sequence[Any], name: str) -> tuple[int, int, int, bytes]:
    """One column's ``(kind, width, flags, raw bytes)`` for ``values`` (``_ABSENT``: missing).

    Also the shard's key column (``shardio.format.blockfile``): str values, none missing.
    """
    kind, width, flags, parts = _column_parts(values, name)
    return kind, width, flags, b"".join(parts)


def _column_parts(values: Sequence[Any], name: str) -> tuple[int, int, int, list[bytes]]:
    """``encode_column``, its raw bytes as the parts they are joined from."""
    present = [v is not _ABSENT for v in values]
    given = [v for v in values if v is not _ABSENT]
    flags = 0 if all(present) else HAS_PRESENCE
    head = np.packbits(np.array(present, np.bool_), bitorder="little").tobytes() if flags else b""
    if given and all(type(v) is int or isinstance(v, np.integer) for v in given) and not any(
            isinstance(v, (bool, np.bool_)) for v in given):
        ints = [int(v) if p else 0 for v, p in zip(values, present, strict=True)]
        if min(ints) >= -(1 << 63) and max(ints) < 1 << 63:
            width = next(w for w in INT_WIDTHS
                         if -(1 << (8 * w - 1)) <= min(ints) and max(ints) < 1 << (8 * w - 1))
            return INT, width, flags, [head, np.array(ints, f"<i{width}").tobytes()]
    if given and all(isinstance(v, (bytes, bytearray, memoryview)) for v in given):
        kind, pieces = BYTES, [bytes(v) if p else b"" for v, p in zip(values, present, strict=True)]
    elif given and all(isinstance(v, str) for v in given):
        kind, pieces = STR, [v.encode("utf-8") if p else b""
                             for v, p in zip(values, present, strict=True)]
    else:
        kind, pieces = MSGPACK, [pack_value(v, name) if p else b""
                                 for v, p in zip(values, present, strict=True)]
    ends = np.cumsum([0, *map(len, pieces)], dtype=np.int64)
    width = 4 if int(ends[-1]) < 1 << 32 else 8
    return kind, width, flags, [head, ends.astype(f"<u{width}").tobytes(), *pieces]


def pack_value(value: Any, name: str) -> bytes:
    """A value of a msgpack column, packed as v2 records pack their values."""
    if isinstance(value, (dict, list, tuple)):
        _check_map_keys(value, name)
    try:
        return msgpack.packb(value, default=_default, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, RecordEncodeError):
            raise
        raise RecordEncodeError(f"field {name!r}: cannot encode value: {exc}") from exc


def store_column(kind: int, values: Sequence[Any], raw: bytes, level: int | None
                 ) -> tuple[int, bytes]:
    """``(codec, stored bytes)`` of a raw column of ``values``: zstd where it pays, else raw.

    Bytes columns whose values are mostly compressed media (JPEG, PNG, ...) are never tried:
    zstd gains under 1% there (docs/format.md, §3). Others are kept compressed when at least
    ``MIN_SAVING`` smaller and within ``MAX_INFLATE_RATIO``.
    """
    if level is None or not raw or (kind == BYTES and _mostly_media(values)):
        return RAW, raw
    packed = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)
    if len(packed) <= len(raw) * (1.0 - MIN_SAVING) and len(raw) <= len(packed) * MAX_INFLATE_RATIO:
        return ZSTD, packed
    return RAW, raw


def _mostly_media(values: Sequence[Any]) -> bool:
    """Whether at least half the bytes of ``values`` are compressed media (JPEG, PNG, ...)."""
    given = [v for v in values if isinstance(v, (bytes, bytearray, memoryview))]
    return 2 * sum(len(v) for v in given if looks_compressed(v)) >= sum(map(len, given))


def check_block(buf: bytes | memoryview, *, path: str, block: int) -> None:
    """Refuse a block whose CRC-32C (of its bytes after the first four) does not match.

    Raises:
        ShardCorruptError: fewer bytes than a block head.
        ChecksumError: naming the file and block.
    """
    view = memoryview(buf)
    _need(len(view) >= HEAD.size, path, block, "{} bytes is shorter than a block head", len(view))
    stored = struct.unpack_from("<I", view)[0]
    actual = checksum_function(CRC32C)(view[4:], 0)
    if stored != actual:
        raise ChecksumError(
            f"{path}: block {block} fails its checksum (stored crc32c {stored:08x}, computed "
            f"{actual:08x}); the shard is corrupt: restore it from a copy or re-pack",
            path=path, record=None, offset=None,
        )


def read_head(buf: bytes | memoryview, *, path: str, block: int,
              first_record: int | None = None, num_records: int | None = None) -> BlockHead:
    """Parse and check a block's head and field table (not its checksum: ``check_block``).

    ``first_record`` and ``num_records``: what the shard's index says of this block; a
    block that says otherwise is refused. Every size is checked against ``len(buf)``.

    Raises:
        ShardCorruptError: the first thing that disagrees, naming file and block.
    """
    view = memoryview(buf)
    size = len(view)
    _need(size >= HEAD.size, path, block, "{} bytes is shorter than a block head", size)
    crc, count, first, num_columns, table_bytes, stated = HEAD.unpack_from(view)
    _need(stated == size, path, block, "the block says it is {} bytes, its place {}", stated, size)
    _need(count >= 1, path, block, "the block holds no record")
    _need(num_records is None or count == num_records, path, block,
          "the block holds {} records, the shard's index says {}", count, num_records)
    _need(first_record is None or first == first_record, path, block,
          "the block starts at record {}, the shard's index says {}", first, first_record)
    _need(table_bytes <= size - HEAD.size and num_columns <= table_bytes // ENTRY.size, path,
          block, "a field table of {} columns in {} bytes does not fit", num_columns, table_bytes)
    columns: list[ColumnEntry] = []
    at, end = HEAD.size, HEAD.size + table_bytes
    data_at = end
    for _ in range(num_columns):
        _need(at + ENTRY.size <= end, path, block, "the field table is cut short")
        kind, codec, flags, width, stored, raw, name_len = ENTRY.unpack_from(view, at)
        at += ENTRY.size
        _need(at + name_len <= end, path, block, "a field name runs past the field table")
        try:
            name: str | None = str(view[at : at + name_len], "utf-8")
        except UnicodeDecodeError:
            name = None
        at += name_len
        _need(name is not None and name not in (KEY_FIELD, INDEX_FIELD)
              and all(c.name != name for c in columns), path, block,
              "field name {!r} is not UTF-8, reserved or repeated", name)
        assert name is not None
        _need(kind <= MSGPACK and codec <= ZSTD and flags <= HAS_PRESENCE
              and width in (INT_WIDTHS if kind == INT else OFFSET_WIDTHS), path, block,
              "column {!r}: kind {}, codec {}, flags {}, width {}", name, kind, codec, flags,
              width)
        _need(stored <= size - data_at, path, block,
              "column {!r} claims {} bytes, the block has {} left", name, stored, size - data_at)
        _need(raw == stored if codec == RAW else stored > 0 and raw <= stored * MAX_INFLATE_RATIO,
              path, block, "column {!r} claims {} raw bytes from {} stored", name, raw, stored)
        _need(raw >= raw_minimum(kind, flags, width, count), path, block,
              "column {!r} of {} bytes is too short for {} records", name, raw, count)
        columns.append(ColumnEntry(name, kind, codec, flags, width, stored, raw, data_at))
        data_at += stored
    _need(at == end and data_at == size, path, block,
          "the field table and columns do not fill the block exactly")
    return BlockHead(crc, count, first, tuple(columns), size)


def raw_minimum(kind: int, flags: int, width: int, count: int) -> int:
    """Bytes a raw column of ``count`` records takes at least (bitmap, offsets or ints)."""
    bitmap = (count + 7) // 8 if flags & HAS_PRESENCE else 0
    return bitmap + width * (count if kind == INT else count + 1)


def decode_columns(buf: bytes | memoryview, head: BlockHead, *, path: str, block: int
                   ) -> list[Column]:
    """Every column of a checked block, inflated where stored with zstd, offsets checked."""
    view = memoryview(buf)
    out = []
    for entry in head.columns:
        stored = view[entry.at : entry.at + entry.stored]
        raw = stored if entry.codec == RAW else _inflate(stored, entry, path, block)
        out.append(parse_column(raw, entry.name, entry.kind, entry.flags, entry.width,
                                head.num_records, path=path, block=block))
    return out


def _inflate(stored: memoryview, entry: ColumnEntry, path: str, block: int) -> memoryview:
    """A zstd column inflated to exactly its stated raw size (checked before allocating)."""
    try:
        claimed = zstandard.frame_content_size(stored)
        _need(claimed == entry.raw, path, block,
              "column {!r}: its zstd frame holds {} bytes, the table {}", entry.name, claimed,
              entry.raw)
        raw = decompressor().decompress(stored, max_output_size=entry.raw)
    except zstandard.ZstdError as exc:
        raise ShardCorruptError(
            f"{path}: block {block}, column {entry.name!r} passed its checksum but does not "
            f"inflate ({exc}); the shard was written by a broken writer: re-pack it", path=path,
        ) from exc
    _need(len(raw) == entry.raw, path, block, "column {!r} inflates to {} bytes, the table says {}",
          entry.name, len(raw), entry.raw)
    return memoryview(raw)


def parse_column(raw: memoryview, name: str, kind: int, flags: int, width: int, count: int,
                 *, path: str, block: int) -> Column:
    """A raw column of ``count`` records as arrays and a data view; its structure checked."""
    at = 0
    present: BoolArray | None = None
    _need(len(raw) >= raw_minimum(kind, flags, width, count), path, block,
          "column {!r} of {} bytes is too short for {} records", name, len(raw), count)
    if flags & HAS_PRESENCE:
        nbytes = (count + 7) // 8
        bits = np.unpackbits(np.frombuffer(raw, np.uint8, nbytes), bitorder="little")
        present = bits[:count].astype(np.bool_)
        _need(not bits[count:].any() and bool(present.any()) and not bool(present.all()), path,
              block, "column {!r}: its presence bitmap is not canonical", name)
        at = nbytes
    if kind == INT:
        _need(len(raw) == at + width * count, path, block,
              "int column {!r} is {} bytes, {} records of {} need {}", name, len(raw), count,
              width, at + width * count)
        ints = np.frombuffer(raw, _INT_TYPES[width], count, at).astype(np.int64)
        _need(present is None or not ints[~present].any(), path, block,
              "int column {!r} holds a value for a record without the field", name)
        return Column(name, kind, present, None, None, ints)
    offsets = np.frombuffer(raw, _OFFSET_TYPES[width], count + 1, at).astype(np.int64)
    data = raw[at + width * (count + 1) :]
    steps = np.diff(offsets)
    _need(int(offsets[0]) == 0 and int(offsets[-1]) == len(data)
          and (count == 0 or int(steps.min()) >= 0), path, block,
          "column {!r}: offsets do not span its {} data bytes in order", name, len(data))
    _need(present is None or not steps[~present].any(), path, block,
          "column {!r} holds bytes for a record without the field", name)
    return Column(name, kind, present, offsets, data, None)


def decode_block(buf: bytes | memoryview, *, path: str, block: int, verify: bool = True,
                 first_record: int | None = None, num_records: int | None = None
                 ) -> list[dict[str, Any]]:
    """Check a block (checksum first, with ``verify``) and return its records' sample dicts,
    without ``__key__`` (the shard's key column has it)."""
    if verify:
        check_block(buf, path=path, block=block)
    head = read_head(buf, path=path, block=block, first_record=first_record,
                     num_records=num_records)
    samples: list[dict[str, Any]] = [{} for _ in range(head.num_records)]
    for column in decode_columns(buf, head, path=path, block=block):
        rows = range(head.num_records) if column.present is None else np.flatnonzero(
            column.present).tolist()
        for i in rows:
            samples[i][column.name] = column.value(i, path=path, block=block)
    return samples


def _need(ok: bool, path: str, block: int, what: str, *values: object) -> None:
    """Raise the ``ShardCorruptError`` for block ``block`` unless ``ok``: ``what`` filled
    with ``values`` (``str.format``), formatted only then, as a block is checked often."""
    if not ok:
        raise ShardCorruptError(
            f"{path}: block {block} is malformed: {what.format(*values)}; the shard is "
            "corrupt: restore it from a copy or re-pack", path=path,
        )
