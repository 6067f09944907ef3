"""Format v3 shard files: blocks of records, a block index, the key column and a footer.

A v3 shard (docs/format.md, §8) is a sequence of blocks (``shardio.format.block``) of
consecutive records, each at most ``max_block_bytes`` of raw values unless it holds
one larger record alone. The ``.rec`` file is::

    header (32) | block 0 | ... | block B-1 | index | key section | footer (48)

The index holds ``B + 1`` block offsets and ``B + 1`` first records, so record ``i``
is in block ``searchsorted(first, i, "right") - 1``; the key section holds every
record's ``__key__`` as one str column whose offsets are never compressed (so a
record count is bounded by the bytes that hold it). An LMDB shard stores the same
blocks as values under their 8-byte big-endian block number and the same index and
key section beside them (``lmdb_entries``). This module turns samples into those
bytes and parses them back, checking every count against the bytes that hold it;
the file I/O is its callers' (``RecFileWriter3`` writes to a file object it is given).
Imports from shardio only ``errors``, ``checksum``, ``format`` and ``block``.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Final, overload

import msgpack
import numpy as np
import zstandard

from shardio.errors import (
    ChecksumError,
    RecordEncodeError,
    ShardCorruptError,
    TruncatedShardError,
    UnsupportedVersionError,
)
from shardio.format.block import HEAD as BLOCK_HEAD
from shardio.format.block import (
    MAX_INFLATE_RATIO,
    RAW,
    STR,
    ZSTD,
    Int64Array,
    encode_block,
    encode_column,
    pack_value,
    parse_column,
    store_column,
)
from shardio.format.checksum import CRC32C, checksum_function, decode_name, digest, encode_name
from shardio.format.frames import FORMAT_NAME, HEADER_V2, SHARD_MAGIC, RunBytes
from shardio.format.record import INDEX_FIELD, KEY_FIELD

VERSION: Final = 3
HEADER: Final = HEADER_V2
"""The v2 header with version 3: magic, version, flags (0), checksum name, 8 zero bytes."""
FOOTER = struct.Struct("<QQQQII8s")
"""Index offset, keys offset, records, blocks, CRC-32C of index and keys, version, magic."""
KEYS_HEAD = struct.Struct("<BB6xQQ")
"""Key section head: codec of the key data, offset width, key data stored and raw bytes."""
DEFAULT_MAX_BLOCK_BYTES: Final = 512 << 10
"""Raw value bytes a block of several records holds at most: benchmarks/results/block_size.json
and, once readers keep decoded blocks, benchmarks/results/warm.json against
warm-block-128k.json (docs/format.md, §8.3; docs/decisions.md)."""
MIN_RECORD_BYTES: Final = 4
"""Bytes a v3 record takes in its shard at least: its key's offset in the key section."""
FIELD_OVERHEAD: Final = 8
"""Raw bytes a block counts per field value beyond the value (its offset, its bitmap bit)."""
META_KEY: Final = b"__shardio__"
INDEX_KEY: Final = b"__shardio_index__"
KEYS_KEY: Final = b"__shardio_keys__"
MAX_META_BYTES: Final = 1024


@dataclass(frozen=True)
class ShardIndex3:
    """A v3 shard's checked index and keys: where each record's block is."""

    first_records: Int64Array
    """``B + 1`` entries: block ``b`` holds records ``first_records[b]:first_records[b+1]``."""
    block_offsets: Int64Array | None
    """``.rec``: block ``b`` is bytes ``block_offsets[b]:block_offsets[b+1]``; LMDB: None."""
    keys: Sequence[str]
    keys_crc32: int
    """zlib CRC-32 of the key section as stored: the manifest's ``keys_crc32``."""

    @property
    def num_records(self) -> int:
        """Records in the shard."""
        return int(self.first_records[-1])

    @property
    def num_blocks(self) -> int:
        """Blocks in the shard."""
        return len(self.first_records) - 1

    def locate(self, record: int) -> tuple[int, int]:
        """``(block, position in it)`` of ``record``: a binary search of ``B + 1`` entries."""
        if not 0 <= record < self.num_records:
            raise IndexError(f"record {record} out of range 0..{self.num_records - 1}")
        block = int(np.searchsorted(self.first_records, record, side="right")) - 1
        return block, record - int(self.first_records[block])


class BlockIndex:
    """A v3 shard's index as a reader walks it: records to blocks, blocks to bytes."""

    def __init__(self, index: ShardIndex3) -> None:
        self.index = index
        self.firsts: list[int] = index.first_records.tolist()
        self.offsets: list[int] = ([] if index.block_offsets is None
                                   else index.block_offsets.tolist())

    def blocks(self, start: int, stop: int) -> tuple[int, int]:
        """Blocks ``b0..b1`` holding records ``start..stop`` (none when the run is empty)."""
        b0 = bisect.bisect_right(self.firsts, start) - 1
        if stop <= start:
            return b0, b0
        return b0, min(bisect.bisect_left(self.firsts, stop, b0), len(self.firsts) - 1)

    def byte_span(self, start: int, stop: int) -> tuple[int, int]:
        """The bytes of the ``.rec`` file holding records ``start..stop``: whole blocks."""
        b0, b1 = self.blocks(start, stop)
        return self.offsets[b0], self.offsets[b1]

    def run(self, view: memoryview, start: int, stop: int, at: int = 0) -> RunBytes:
        """Records ``start..stop`` as their blocks in ``view``, which holds the file's bytes
        from ``at``."""
        b0, b1 = self.blocks(start, stop)
        base = self.offsets[b0]
        bounds = np.asarray(self.offsets[b0 : b1 + 1], np.int64) - base
        return RunBytes(view[base - at : self.offsets[b1] - at], bounds, CRC32C, None, base,
                        np.asarray(self.firsts[b0 : b1 + 1], np.int64), (start, stop), b0)


def record_bytes(sample: Mapping[str, Any]) -> int:
    """Raw bytes a record counts towards its block's bound: its values plus ``FIELD_OVERHEAD``
    each (bytes and str by length, numbers 8, anything else by its msgpack size).

    Also the check that a block can store every name and value of ``sample``, so that a
    writer refuses the sample it is given rather than the block it closes later.

    Raises:
        RecordEncodeError: a field name that is not a str, or reserved; a str that is not
            UTF-8 (a lone surrogate); an int outside msgpack's range; a value msgpack
            cannot pack. The message names the field.
    """
    total = 0
    for name, value in sample.items():
        if not isinstance(name, str) or name == INDEX_FIELD:
            raise RecordEncodeError(f"field name {name!r} cannot be stored: names are str, "
                                    f"and {INDEX_FIELD} is reserved")
        if not name.isascii():
            _utf8(name, name)
        if isinstance(value, str):
            if not value.isascii():
                _utf8(value, name)
            if name == KEY_FIELD:  # stored in the key column, not a block
                continue
            total += len(value)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            total += len(value)
        elif isinstance(value, (int, float, bool)) or value is None:
            if type(value) is int and not -(1 << 63) <= value < 1 << 64:
                raise RecordEncodeError(f"field {name!r}: the int {value} is outside the "
                                        "64-bit range records store; store it as a str")
            total += 8
        elif isinstance(value, np.ndarray):
            total += value.nbytes
        else:  # a nested value: its packed size (the block encodes it again, once)
            total += len(pack_value(value, name))
        total += FIELD_OVERHEAD
    return total


def _utf8(text: str, name: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordEncodeError(f"field {name!r}: {text[:40]!r} is not UTF-8 text "
                                f"({exc.reason} at {exc.start})") from exc


class ShardEncoder3:
    """Samples in, v3 blocks out: groups consecutive records by ``max_block_bytes``.

    A record joins the open block while the block's ``record_bytes`` stay within the
    bound; a record over the bound is a block of its own.
    """

    def __init__(self, *, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
                 level: int | None = 3, block_records: int | None = None) -> None:
        """``level``: zstd level for columns where it pays; None stores every column raw.
        ``block_records``: every block holds exactly this many records (the last fewer),
        whatever their bytes, so that a reading plan's blocks can be whole blocks
        (``block_records_for``); None: blocks bounded by ``max_block_bytes``."""
        if max_block_bytes <= 0 or (block_records is not None and block_records <= 0):
            raise ValueError(f"max_block_bytes and block_records must be positive, got "
                             f"{max_block_bytes} and {block_records}")
        self.max_block_bytes = max_block_bytes
        self.block_records = block_records
        self.level = level
        self.keys: list[str] = []
        self.first_records: list[int] = [0]
        self._open: list[Mapping[str, Any]] = []
        self._open_bytes = 0

    def add(self, sample: Mapping[str, Any]) -> list[bytes]:
        """Take the next sample (with its str ``__key__``); return the blocks it closed."""
        key = sample.get(KEY_FIELD)
        if not isinstance(key, str):
            raise RecordEncodeError(f"every sample needs a str {KEY_FIELD}, got {key!r}")
        size = record_bytes(sample)
        out = []
        if self._open and (len(self._open) >= self.block_records if self.block_records
                           else self._open_bytes + size > self.max_block_bytes):
            out = self.finish()
        self.keys.append(key)
        self._open.append({k: v for k, v in sample.items() if k != KEY_FIELD})
        self._open_bytes += size
        return out

    def finish(self) -> list[bytes]:
        """Close the open block (if any) and return it."""
        if not self._open:
            return []
        block = encode_block(self._open, first_record=self.first_records[-1], level=self.level)
        self.first_records.append(self.first_records[-1] + len(self._open))
        self._open, self._open_bytes = [], 0
        return [block]


def block_records_for(mean_record_bytes: float,
                      max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> int:
    """Records a block of a dataset whose records take ``mean_record_bytes`` each (as
    ``record_bytes`` counts) holds: as many as fill ``max_block_bytes``, at least one."""
    return max(1, int(max_block_bytes // max(mean_record_bytes, 1.0)))


def encode_keys(keys: Sequence[str], level: int | None) -> bytes:
    """The key section: ``KEYS_HEAD``, the offsets (raw), the UTF-8 keys (zstd where it pays)."""
    _kind, width, _flags, raw = encode_column(list(keys), KEY_FIELD)
    split = width * (len(keys) + 1)
    data = raw[split:]
    codec, stored = store_column(STR, [], data, level)
    return KEYS_HEAD.pack(codec, width, len(stored), len(data)) + raw[:split] + stored


def inflate_key_data(section: bytes | memoryview, *, path: str) -> bytes:
    """The UTF-8 keys of a key section back to back (inflated where stored with zstd,
    within the size its head states): what a search for a key's bytes looks through."""
    view = memoryview(section)
    _need(len(view) >= KEYS_HEAD.size, path, "the key section is shorter than its head")
    codec, _width, stored, raw = KEYS_HEAD.unpack_from(view)
    data = view[len(view) - stored :] if stored <= len(view) - KEYS_HEAD.size else view[:0]
    if codec != ZSTD:
        return bytes(data)
    try:
        _need(raw <= stored * MAX_INFLATE_RATIO and zstandard.frame_content_size(data) == raw,
              path, "the key data's size differs")
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=raw)
    except zstandard.ZstdError as exc:
        raise ShardCorruptError(f"{path}: the key section does not inflate ({exc}); "
                                "re-pack the shard", path=path) from exc


def decode_keys(section: bytes | memoryview, num_records: int, *, path: str) -> Sequence[str]:
    """The keys of a key section that must hold ``num_records``; its sizes checked first."""
    view = memoryview(section)
    _need(len(view) >= KEYS_HEAD.size, path, "the key section is shorter than its head")
    codec, width, stored, raw = KEYS_HEAD.unpack_from(view)
    split = KEYS_HEAD.size + width * (num_records + 1)
    _need(width in (4, 8) and codec <= ZSTD and split + stored == len(view) and (
        raw == stored if codec == RAW else stored > 0 and raw <= stored * MAX_INFLATE_RATIO),
        path, f"the key section ({len(view)} bytes: codec {codec}, width {width}, {stored} "
        f"stored, {raw} raw) does not hold {num_records} keys")
    data: bytes | memoryview = view[split:]
    if codec == ZSTD:
        try:
            _need(zstandard.frame_content_size(data) == raw, path, "the key data's size differs")
            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw)
        except zstandard.ZstdError as exc:
            raise ShardCorruptError(f"{path}: the key section does not inflate ({exc}); "
                                    "re-pack the shard", path=path) from exc
    column = parse_column(memoryview(bytes(view[KEYS_HEAD.size : split]) + bytes(data)),
                          KEY_FIELD, STR, 0, width, num_records, path=path, block=-1)
    assert column.offsets is not None and column.data is not None
    ends, keys = column.offsets.tolist(), column.data
    whole = bytes(keys)
    if whole.isascii():  # every slice decodes: each key is decoded when first asked for
        return KeyColumn(whole, ends)
    try:
        return [str(keys[ends[i] : ends[i + 1]], "utf-8") for i in range(num_records)]
    except UnicodeDecodeError as exc:
        raise ShardCorruptError(f"{path}: a key is not UTF-8; re-pack the shard",
                                path=path) from exc


class KeyColumn(Sequence[str]):
    """A shard's ASCII keys, each cut from the key column's text when asked for.

    Decoding every key into its own ``str`` when a shard opened was the largest cost of the
    first batch on a dataset of 10^5 samples (35 of 127 ms), and recurred at every open
    (``python -m benchmarks.first_sample --samples 100000 --workers 0`` measures the first
    batch). ASCII decodes as one copy, so the column is one ``str`` and a key a slice of it:
    keys decoded one by one from the bytes took a warm epoch of 10^4 tiny samples from 46
    to 49 ms (a fresh process's ``shardio.loader`` epoch, medians of 6 alternated runs; the
    quick harness's ``shardio-records`` warm row, ``python -m benchmarks.run --quick``).
    """

    __slots__ = ("_ends", "_text")

    def __init__(self, data: bytes, ends: list[int]) -> None:
        self._text, self._ends = data.decode("ascii"), ends

    def __len__(self) -> int:
        return len(self._ends) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return self.take(range(*i.indices(len(self))))
        n = len(self._ends) - 1
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"key {i} out of range for {n} keys")
        return self._text[self._ends[i] : self._ends[i + 1]]

    def take(self, positions: Iterable[int]) -> list[str]:
        """The keys at ``positions`` (each in range), in that order."""
        text, ends = self._text, self._ends
        return [text[ends[j] : ends[j + 1]] for j in positions]

    def __iter__(self) -> Iterator[str]:
        text = self._text
        return (text[a:b] for a, b in itertools.pairwise(self._ends))

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KeyColumn({len(self)} keys)"


class RecFileWriter3:
    """Writes one v3 ``.rec`` shard to ``fh``, computing its file checksum as it goes."""

    def __init__(self, fh: BinaryIO, *, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
                 level: int | None = 3, block_records: int | None = None) -> None:
        self._fh = fh
        self._encoder = ShardEncoder3(max_block_bytes=max_block_bytes, level=level,
                                      block_records=block_records)
        self._compute = checksum_function(CRC32C)
        self._crc = self._size = 0
        self._offsets: list[int] = []
        self._write(HEADER.pack(SHARD_MAGIC, VERSION, 0, encode_name(CRC32C)))

    def _write(self, data: bytes) -> None:
        self._fh.write(data)
        self._crc = self._compute(data, self._crc)
        self._size += len(data)

    def _blocks(self, blocks: list[bytes]) -> None:
        for block in blocks:
            self._offsets.append(self._size)
            self._write(block)

    def append(self, sample: Mapping[str, Any]) -> None:
        """Add the next record (a sample with its ``__key__``)."""
        self._blocks(self._encoder.add(sample))

    def finish(self) -> tuple[int, str, int]:
        """Write the last block, index, keys and footer.

        Returns:
            ``(bytes, "crc32c:<hex>", keys_crc32)`` of the file.
        """
        self._blocks(self._encoder.finish())
        enc = self._encoder
        index_offset = self._size
        index = np.array([*self._offsets, index_offset], "<u8").tobytes() + np.array(
            enc.first_records, "<u8").tobytes()
        keys = encode_keys(enc.keys, enc.level)
        self._write(index + keys)
        self._write(FOOTER.pack(index_offset, index_offset + len(index), len(enc.keys),
                                len(self._offsets), self._compute(index + keys, 0), VERSION,
                                SHARD_MAGIC))
        return self._size, digest(CRC32C, self._crc), zlib.crc32(keys)


def lmdb_entries(samples: Sequence[Mapping[str, Any]], *,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES, level: int | None = 3
                 ) -> list[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of a v3 LMDB shard holding ``samples``, in key order: block
    ``b`` under ``b`` as 8 big-endian bytes, then the metadata, index and key section."""
    encoder = ShardEncoder3(max_block_bytes=max_block_bytes, level=level)
    blocks = [b for sample in samples for b in encoder.add(sample)] + encoder.finish()
    return [*((block_key(b), block) for b, block in enumerate(blocks)), *lmdb_tail(encoder)]


def block_key(block: int) -> bytes:
    """The LMDB key of block ``block``: 8 big-endian bytes."""
    return block.to_bytes(8, "big")


def lmdb_tail(encoder: ShardEncoder3) -> list[tuple[bytes, bytes]]:
    """The metadata, index and key section entries of a v3 LMDB shard whose blocks
    ``encoder`` made (all of them: ``finish`` was called)."""
    index = np.array(encoder.first_records, "<u8").tobytes()
    keys = encode_keys(encoder.keys, encoder.level)
    meta = {"format": FORMAT_NAME, "version": VERSION, "checksum": CRC32C,
            "num_records": len(encoder.keys), "num_blocks": len(encoder.first_records) - 1,
            "index_crc32c": checksum_function(CRC32C)(index, 0),
            "keys_bytes": len(keys), "keys_crc32": zlib.crc32(keys)}
    return [(META_KEY, msgpack.packb(meta, use_bin_type=True)), (INDEX_KEY, index),
            (KEYS_KEY, keys)]


@dataclass(frozen=True)
class Footer3:
    """A v3 ``.rec`` footer, its offsets checked against the file's size."""

    index_offset: int
    keys_offset: int
    num_records: int
    num_blocks: int
    checksum: int
    tail_bytes: int
    """Bytes from the index to the end of the file: what ``parse_rec`` needs of the tail."""


def tail_size(num_records: int, num_blocks: int, key_bytes: int) -> int:
    """Bytes of a v3 shard's tail (index, key section with 4-byte offsets, footer) whose key
    data takes ``key_bytes``: what a remote reader's first GET asks for, with the key data
    guessed (``remoterecords.tail_guess``)."""
    return (16 * (num_blocks + 1) + KEYS_HEAD.size + 4 * (num_records + 1)
            + key_bytes + FOOTER.size)


def parse_footer(tail: bytes | memoryview, size: int, *, path: str) -> Footer3:
    """The footer in the last ``FOOTER.size`` bytes of ``tail`` (the end of a file of
    ``size`` bytes), its counts bounded by the bytes that hold them."""
    if size < HEADER.size + FOOTER.size or len(tail) < FOOTER.size:
        raise TruncatedShardError(f"{path}: {size} bytes is too short for a v3 shard; it is "
                                  "truncated: re-pack it", path=path)
    index_offset, keys_offset, count, blocks, crc, version, magic = FOOTER.unpack_from(
        tail, len(tail) - FOOTER.size)
    if magic != SHARD_MAGIC:
        raise TruncatedShardError(f"{path}: no shard footer at byte {size - FOOTER.size} (the "
                                  "file is truncated or was not finished); re-pack it", path=path)
    _check_version(version, path)
    _need(HEADER.size + BLOCK_HEAD.size * blocks <= index_offset
          and index_offset + 16 * (blocks + 1) == keys_offset
          and keys_offset + KEYS_HEAD.size + MIN_RECORD_BYTES * (count + 1) <= size - FOOTER.size,
          path, f"footer offsets are inconsistent (index at {index_offset}, keys at "
          f"{keys_offset}, {count} records in {blocks} blocks, file of {size} bytes)")
    return Footer3(index_offset, keys_offset, count, blocks, crc, size - index_offset)


def parse_rec(head: bytes | memoryview, tail: bytes | memoryview, size: int, *, path: str
              ) -> ShardIndex3:
    """Check a v3 ``.rec`` shard's header, footer, index and keys.

    Args:
        head: the file's first ``HEADER.size`` bytes.
        tail: its last bytes: at least ``parse_footer(...).tail_bytes`` (the whole file will do).
        size: the file's size.

    Raises:
        ValueError: ``tail`` is shorter than the footer says the tail is (fetch more).
    """
    check_header(head, path=path)
    return parse_tail(tail, size, path=path)


def check_header(head: bytes | memoryview, *, path: str) -> None:
    """Refuse a v3 ``.rec`` header (the file's first ``HEADER.size`` bytes) that is not v3's."""
    if len(head) < HEADER.size:
        raise TruncatedShardError(f"{path}: {len(head)} bytes is too short for a v3 shard "
                                  "header; re-pack it", path=path)
    magic, version, flags, name = HEADER.unpack_from(head)
    _need(magic == SHARD_MAGIC, path, f"not a shardio shard (magic {magic!r})")
    _check_version(version, path)
    _need(flags == 0 and decode_name(name) == CRC32C and not any(bytes(head[24:32])), path,
          "the header's flags, checksum name or reserved bytes are not v3's")


def parse_tail(tail: bytes | memoryview, size: int, *, path: str) -> ShardIndex3:
    """Check a v3 ``.rec`` shard's footer, index and keys from ``tail``, its last bytes (at
    least ``parse_footer(...).tail_bytes``; a remote reader fetches only those).

    Raises:
        ValueError: ``tail`` is shorter than the footer says the tail is (fetch more).
    """
    footer = parse_footer(tail, size, path=path)
    if len(tail) < footer.tail_bytes:
        raise ValueError(f"{path}: the tail given holds {len(tail)} bytes, the footer needs "
                         f"{footer.tail_bytes}")
    index_offset, blocks, crc = footer.index_offset, footer.num_blocks, footer.checksum
    count, index_bytes = footer.num_records, 16 * (blocks + 1)
    body = memoryview(tail)[len(tail) - footer.tail_bytes : len(tail) - FOOTER.size]
    if checksum_function(CRC32C)(body, 0) != crc:
        raise ChecksumError(f"{path}: the block index and key section (bytes {index_offset}.."
                            f"{size - FOOTER.size}) fail their checksum; the shard is corrupt: "
                            "restore it from a copy or re-pack", path=path, offset=index_offset)
    offsets = np.frombuffer(body, "<u8", blocks + 1).astype(np.int64)
    first = np.frombuffer(body, "<u8", blocks + 1, 8 * (blocks + 1)).astype(np.int64)
    _need(int(offsets[0]) == HEADER.size and int(offsets[-1]) == index_offset
          and bool((np.diff(offsets) >= BLOCK_HEAD.size).all()), path,
          "the block offsets do not span the block area in order")
    return _index(first, offsets, body[index_bytes:], count, path)


def parse_lmdb(meta: bytes | memoryview, index: bytes | memoryview, keys: bytes | memoryview,
               num_values: int, *, path: str) -> ShardIndex3:
    """Check a v3 LMDB shard's metadata, index and key section (``num_values``: the number
    of block values the file holds)."""
    found: Any = None
    if len(meta) <= MAX_META_BYTES:
        try:
            found = msgpack.unpackb(meta, raw=False)
        except Exception:  # msgpack raises several unrelated types on bad input
            found = None
    _need(isinstance(found, dict) and found.get("format") == FORMAT_NAME, path,
          f"the entry {META_KEY.decode()!r} is not shardio metadata")
    _check_version(found.get("version"), path)
    fields = ("num_records", "num_blocks", "index_crc32c", "keys_bytes", "keys_crc32")
    _need(found.get("checksum") == CRC32C and all(type(found.get(f)) is int for f in fields)
          and found["num_blocks"] == num_values and len(index) == 8 * (num_values + 1)
          and len(keys) == found["keys_bytes"] and zlib.crc32(keys) == found["keys_crc32"]
          and checksum_function(CRC32C)(index, 0) == found["index_crc32c"], path,
          f"metadata {found} does not match the {num_values} blocks, index and keys it holds")
    first = np.frombuffer(index, "<u8").astype(np.int64)
    return _index(first, None, memoryview(keys), found["num_records"], path)


def _index(first: Int64Array, offsets: Int64Array | None, keys: memoryview, count: int,
           path: str) -> ShardIndex3:
    """The checked index: first records from 0 to ``count``, each block holding one or more."""
    _need(int(first[0]) == 0 and int(first[-1]) == count and bool((np.diff(first) >= 1).all()),
          path, f"the block index does not cover records 0..{count} in order")
    return ShardIndex3(first, offsets, decode_keys(keys, count, path=path),
                       zlib.crc32(keys))


def _check_version(version: object, path: str) -> None:
    if version != VERSION:
        raise UnsupportedVersionError(
            f"{path}: written by shardio format version {version!r}; this reader reads v3 "
            "here. Upgrade shardio to read it.", path=path)


def _need(ok: bool, path: str, what: str) -> None:
    if not ok:
        raise ShardCorruptError(f"{path}: {what}; the shard is corrupt: restore it from a copy "
                                "or re-pack", path=path)
