"""Formats v1 and v2 on the byte level: constants, struct layouts, record frames and their checks.

This module owns every byte layout of docs/format.md and nothing else: it does
no file I/O and imports no other shardio module but ``errors`` and
``checksum``. A record frame is the same in every backend, so frames read from
an LMDB value, a mapped ``.rec`` file or a downloaded range are checked by the
same function here, ``check_frames``, with the checksum the shard names.

Record frame (little-endian)::

    u32 payload_length | u32 checksum | u8 codec | u8 checksum id | 2 bytes zero | payload

The checksum covers the frame from byte 8 to the end. Id 0 is zlib's CRC-32
(every v1 frame: v1 wrote zeros there), id 1 CRC-32C (v2). A v2 ``.rec`` shard
also keeps a *chain* beside its offset index: the CRC-32C of the file up to
each record, so any run of consecutive records is checked with one call.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shardio.errors import (
    ChecksumError,
    ShardCorruptError,
    TruncatedShardError,
    UnsupportedVersionError,
)
from shardio.format.checksum import (
    CRC32,
    DEFAULT,
    IDS,
    NAMES,
    checksum_function,
    decode_name,
    encode_name,
)

FORMAT_NAME: Final = "shardio"
FORMAT_VERSION: Final = 3
SUPPORTED_VERSIONS: Final = frozenset({1, 2, 3})
FRAMED_VERSIONS: Final = frozenset({1, 2})
"""The versions whose shards hold one frame a record (this module's layouts); v3 shards hold
blocks (``shardio.format.blockfile``)."""
LAST_FRAMED_VERSION: Final = 2
"""What a v1 or v2 dataset grows in (append, merge): its shards stay framed."""
CHECKSUM_OF_VERSION: Final = {1: CRC32, 2: DEFAULT, 3: DEFAULT}
"""The checksum a writer of each version uses (v2 readers accept any name in ``NAMES``)."""

CODEC_NONE: Final = 0
CODEC_ZSTD: Final = 1

SHARD_MAGIC: Final = b"SHARDIO\x00"
HEADER = struct.Struct("<8sII")
"""v1 shard header: magic, format version, flags (zero). v2 starts the same way."""
HEADER_V2 = struct.Struct("<8sII8s8x")
"""v2 shard header: magic, version, flags (zero), checksum name (NUL-padded), 8 zero bytes."""
HEADER_SIZES: Final = {1: HEADER.size, 2: HEADER_V2.size}

FRAME = struct.Struct("<IIBB2x")
"""Record frame header: payload length, checksum of bytes 8.., codec id, checksum id."""
_HEAD = struct.Struct("<IIBBH")
_U32 = struct.Struct("<I")
"""``FRAME`` with its reserved bytes, which must be zero."""
VECTOR_MIN_RECORDS: Final = 128
"""Runs at least this long have their frame headers parsed with numpy, shorter ones in a loop."""

FOOTER = struct.Struct("<QQQII8s")
"""v1 footer: index offset, keys offset, record count, index crc32, version, magic."""
FOOTER_V2 = struct.Struct("<QQQI8sI8s")
"""v2 footer: index offset, keys offset, record count, index checksum, checksum name,
version, magic. Version and magic end both footers, so the last 12 bytes say which it is."""
FOOTER_SIZES: Final = {1: FOOTER.size, 2: FOOTER_V2.size}
_TAIL = struct.Struct("<I8s")

FRAME_SIZE: Final = FRAME.size
HEADER_SIZE: Final = HEADER.size
"""The v1 header; a v2 header is ``HEADER_SIZES[2]``."""
FOOTER_SIZE: Final = FOOTER.size
"""The v1 footer, also the shortest; a v2 footer is ``FOOTER_SIZES[2]``."""
INDEX_ENTRY_BYTES: Final = {1: 8, 2: 12}
"""Index bytes per offset: a u64 offset, and in v2 a u32 chain value too."""
TAIL_GUESS_KEY_BYTES: Final = 64
"""Key block bytes per record ``tail_bytes`` allows for (paths of ~60 characters)."""

if TYPE_CHECKING:  # numpy is imported where runs are checked: `import shardio` stays light
    import numpy as np
    import numpy.typing as npt

    Bounds = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Footer:
    """The fixed-size tail of a ``.rec`` shard: where its index and key list start."""

    index_offset: int
    keys_offset: int
    num_records: int
    index_checksum: int
    version: int
    checksum: str
    size: int
    """Bytes of the footer itself (``FOOTER_SIZES[version]``)."""


@dataclass(frozen=True)
class ShardIndex:
    """A ``.rec`` shard's checked index: record offsets, the v2 chain, and the key block."""

    offsets: npt.NDArray[np.uint64]
    chain: npt.NDArray[np.uint32] | None
    """v2: ``chain[i]`` is the checksum of the file's bytes before record ``i``; v1: None."""
    key_block: memoryview


@dataclass(frozen=True)
class RunBytes:
    """Consecutive records of one shard as one buffer: what ``check_frames`` checks.

    ``buffer[bounds[k]:bounds[k+1]]`` is the frame of record ``first_record + k``.
    ``chain`` (v2 ``.rec`` only) holds the chain values at ``bounds``, so the whole
    run is checked with one checksum call; elsewhere each frame's own checksum is.
    """

    buffer: memoryview
    bounds: Bounds
    checksum: str
    chain: npt.NDArray[np.uint32] | None = None
    offset: int = 0
    """File offset of ``buffer[0]`` (for messages); -1 where records have none (LMDB)."""
    blocks: Bounds | None = None
    """Format v3: ``buffer[bounds[k]:bounds[k+1]]`` is a whole block holding records
    ``blocks[k]..blocks[k+1]`` of the shard (``shardio.format.block``); None: frames."""
    span: tuple[int, int] = (0, 0)
    """Format v3: the records ``start..stop`` the run was read for (its blocks hold more)."""
    first_block: int = 0
    """Format v3: the shard's number of the run's first block (for messages)."""
    ends: Bounds | None = None
    """Format v3 where blocks do not lie back to back (LMDB values, between page headers):
    block ``k`` is ``buffer[bounds[k]:ends[k]]``; None: ``ends[k]`` is ``bounds[k+1]``."""

    def block_ends(self) -> list[int]:
        """Where each block of a v3 run ends in ``buffer``."""
        ends: list[int] = (self.bounds[1:] if self.ends is None else self.ends).tolist()
        return ends


def frame(payload: bytes | memoryview, codec: int, checksum: str = DEFAULT) -> bytes:
    """Wrap a stored payload in a record frame with its ``checksum`` (a name of ``NAMES``)."""
    compute = checksum_function(checksum)
    head = bytes((codec, IDS[checksum], 0, 0))
    return FRAME.pack(len(payload), compute(payload, compute(head, 0)), codec, IDS[checksum]
                      ) + payload


def unframe(
    buf: bytes | memoryview, *, path: str, record: int, offset: int = 0, verify: bool = True,
    exact: bool = False, checksum: str | None = None,
) -> tuple[int, memoryview]:
    """Check one record frame and return ``(codec, stored payload)``.

    ``buf`` starts at the frame and may run past its end (a whole mapped shard
    sliced at ``offset``), unless ``exact``: then it is the record as the
    shard's index delimits it, and a frame length that disagrees is refused
    even with ``verify`` off (a damaged length must not move the payload).
    ``checksum``: the shard's, when known; a frame naming another is refused.
    Raises a ``ShardCorruptError`` naming the file, record index and byte
    offset when the frame is cut short or its checksum does not match.
    """
    view = memoryview(buf)
    if len(view) < FRAME_SIZE:
        raise TruncatedShardError(
            f"{path}: record {record} at byte {offset} is cut short: frame header needs "
            f"{FRAME_SIZE} bytes, found {len(view)}; the shard is truncated, re-pack it",
            path=path, record=record, offset=offset,
        )
    length = FRAME.unpack_from(view)[0]
    if len(view) < FRAME_SIZE + length:
        raise TruncatedShardError(
            f"{path}: record {record} at byte {offset} is cut short: expected {length} "
            f"payload bytes, found {len(view) - FRAME_SIZE}; the shard is truncated, re-pack it",
            path=path, record=record, offset=offset,
        )
    end = len(view) if exact else FRAME_SIZE + length
    import numpy as np

    codecs = check_frames(
        RunBytes(view[:end], np.array([0, end], np.int64), checksum or _named(view, path, record,
                                                                            offset)),
        path=path, first_record=record, verify=verify, offset_of=lambda _r: offset,
    )
    return codecs[0], view[FRAME_SIZE:end]


def _named(view: memoryview, path: str, record: int, offset: int) -> str:
    """The checksum a lone frame names (its byte 9)."""
    ident = view[9]
    if ident >= len(NAMES):
        raise ShardCorruptError(
            f"{path}: record {record} at byte {offset} names unknown checksum id {ident}; the "
            "shard is corrupt (or written by a newer shardio): restore it or upgrade shardio",
            path=path, record=record, offset=offset,
        )
    return NAMES[ident]


def check_frames(
    run: RunBytes, *, path: str, first_record: int, verify: bool = True,
    offset_of: Callable[[int], int] | None = None,
) -> list[int]:
    """Check every frame of ``run`` and return their codec ids: the one record check.

    Frame headers are parsed for the whole run at once (numpy over the
    bounds; a struct loop for short runs): each length must fill its record
    exactly (even with ``verify`` off: a damaged length must not move a
    payload), the codec must be known,
    the checksum id the run's and the reserved bytes zero. With ``verify``,
    a run with a chain is checked by one checksum call over the run; without
    one, each frame by its own checksum. The first bad record is named.

    Raises:
        TruncatedShardError, ShardCorruptError, ChecksumError: the first damaged record,
            with file, record and byte offset (``offset_of(record)``, else the run's).
    """
    if run.blocks is not None:
        _check_blocks(run, path, verify)
        return []
    buf, bounds = run.buffer, run.bounds
    count = len(bounds) - 1
    where = offset_of or (lambda r: run.offset + int(bounds[r - first_record]))
    ident = IDS.get(run.checksum)
    if ident is None:
        raise ShardCorruptError(f"{path}: unknown checksum {run.checksum!r}", path=path)
    if count <= 0:
        return []
    bad_length: list[int] = []
    bad_ident: list[int] = []
    bad_header: list[int] = []
    if count < VECTOR_MIN_RECORDS:
        # a loop of struct reads: numpy costs about 13 us a run whatever its length, the
        # loop about 0.1 us a record (docs/decisions.md, "Record checksums")
        edges = bounds.tolist()
        unpack = _HEAD.unpack_from
        codecs = []
        for k in range(count):
            lo, size = edges[k], edges[k + 1] - edges[k]
            if size < FRAME_SIZE:
                _refuse(run, path, first_record, where, k)
            length, _crc, codec, got, reserved = unpack(buf, lo)
            codecs.append(codec)
            if length + FRAME_SIZE != size or got != ident or codec > CODEC_ZSTD or reserved:
                bad_length = [k] if length + FRAME_SIZE != size else []
                bad_ident = [k] if got != ident else []
                bad_header = [k] if codec > CODEC_ZSTD or reserved else []
                break
    else:
        import numpy as np

        sizes = np.diff(bounds)
        if bool((sizes < FRAME_SIZE).any()):
            _refuse(run, path, first_record, where, int(np.argmax(sizes < FRAME_SIZE)))
        arr = np.frombuffer(buf, np.uint8)
        heads = arr[bounds[:-1, None] + np.arange(FRAME_SIZE)].view("<u4")
        words = heads[:, 2]  # codec | checksum id << 8 | reserved << 16
        bad_length = np.flatnonzero(heads[:, 0] + FRAME_SIZE != sizes)[:1].tolist()
        bad_ident = np.flatnonzero((words >> 8 & 0xFF) != ident)[:1].tolist()
        bad_header = np.flatnonzero((words != ident << 8) & (words != (ident << 8 | CODEC_ZSTD))
                                    )[:1].tolist()
        codecs = words.astype(np.uint8).tolist()
    bad_sum = first_failing(run) if verify else None
    # the first damaged record; for one record, its length is judged first (it places the
    # payload), then the checksum it names, then its checksum, then the rest of its header
    # (codec, reserved bytes), as format v1 readers did
    firsts = [k for k in (*bad_length, *bad_ident, bad_sum, *bad_header) if k is not None]
    if not firsts:
        return codecs
    k = min(firsts)
    if k == bad_sum and k not in bad_length and k not in bad_ident:
        compute = checksum_function(run.checksum)
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        if run.chain is None:
            stored, actual = FRAME.unpack_from(buf, lo)[1], compute(buf[lo + 8 : hi], 0)
        else:
            stored, actual = int(run.chain[k + 1]), compute(buf[lo:hi], int(run.chain[k]))
        raise ChecksumError(
            f"{path}: record {first_record + k} at byte {where(first_record + k)} fails its "
            f"checksum (stored {run.checksum} {stored:08x}, computed {actual:08x}); the shard "
            "is corrupt: restore it from a copy or re-pack",
            path=path, record=first_record + k, offset=where(first_record + k),
        )
    _refuse(run, path, first_record, where, k)
    raise AssertionError("unreachable")  # pragma: no cover


def header_codecs(headers: npt.NDArray[np.uint8], sizes: Bounds, checksum: str
                  ) -> npt.NDArray[np.uint8] | None:
    """Codec ids of frames whose headers are gathered: row ``i`` holds (at least) the first
    ``FRAME_SIZE`` bytes of a frame of ``sizes[i]`` bytes, all checked at once.

    None if any frame fails a header check of ``check_frames`` (its length does not fill
    its record, its checksum id is not ``checksum``'s, its codec is unknown, its reserved
    bytes are not zero): ``check_frames`` then names the first.
    """
    import numpy as np

    ident = IDS.get(checksum)
    if ident is None or bool((sizes < FRAME_SIZE).any()):
        return None
    heads = headers[:, :FRAME_SIZE].view("<u4")
    words = heads[:, 2]  # codec | checksum id << 8 | reserved << 16
    if not bool((heads[:, 0] + FRAME_SIZE == sizes).all()) or not bool(
            ((words == ident << 8) | (words == (ident << 8 | CODEC_ZSTD))).all()):
        return None
    codecs: npt.NDArray[np.uint8] = words.astype(np.uint8)
    return codecs


def first_failing(run: RunBytes) -> int | None:
    """The first record of ``run`` whose checksum fails (its chain link, else its frame's;
    v3: the first block whose CRC-32C fails)."""
    compute = checksum_function(run.checksum)
    buf, bounds, chain = run.buffer, run.bounds.tolist(), run.chain
    if run.blocks is not None:
        for k, end in enumerate(run.block_ends()):
            if end - bounds[k] < 4 or compute(buf[bounds[k] + 4 : end], 0
                                              ) != _U32.unpack_from(buf, bounds[k])[0]:
                return k
        return None
    if chain is not None:
        if compute(buf[bounds[0] : bounds[-1]], int(chain[0])) == int(chain[-1]):
            return None
        links = chain.tolist()
        for k in range(len(bounds) - 1):
            if compute(buf[bounds[k] : bounds[k + 1]], links[k]) != links[k + 1]:
                return k
        return len(bounds) - 2  # pragma: no cover - the run failed, so one link did
    unpack = FRAME.unpack_from
    for k in range(len(bounds) - 1):
        if compute(buf[bounds[k] + 8 : bounds[k + 1]], 0) != unpack(buf, bounds[k])[1]:
            return k
    return None


def _check_blocks(run: RunBytes, path: str, verify: bool) -> None:
    """Refuse the first v3 block of ``run`` whose CRC-32C fails, naming it and its records."""
    k = first_failing(run) if verify else None
    if k is None:
        return
    assert run.blocks is not None
    first, stop = int(run.blocks[k]), int(run.blocks[k + 1])
    where = f" at byte {run.offset + int(run.bounds[k])}" if run.offset >= 0 else ""
    raise ChecksumError(
        f"{path}: block {run.first_block + k}{where} (records {first}..{stop - 1}) fails its "
        "checksum; the shard is corrupt: restore it from a copy or re-pack",
        path=path, record=first, offset=run.offset + int(run.bounds[k]) if run.offset >= 0
        else None)


def _refuse(run: RunBytes, path: str, first: int, where: Callable[[int], int], k: int) -> None:
    """Raise the error for frame ``k`` of ``run``, whose header failed a check."""
    record, offset = first + k, where(first + k)
    start, stop = int(run.bounds[k]), int(run.bounds[k + 1])
    size = stop - start
    if size < FRAME_SIZE:
        raise TruncatedShardError(
            f"{path}: record {record} at byte {offset} is cut short: frame header needs "
            f"{FRAME_SIZE} bytes, found {size}; the shard is truncated, re-pack it",
            path=path, record=record, offset=offset,
        )
    length, _crc, codec, ident = FRAME.unpack_from(run.buffer, start)
    if length + FRAME_SIZE != size:
        raise ShardCorruptError(
            f"{path}: record {record} at byte {offset} is {size} bytes in the shard's index but "
            f"its frame header says {length + FRAME_SIZE}; the shard is corrupt: restore it "
            "from a copy or re-pack",
            path=path, record=record, offset=offset,
        )
    if ident == IDS[run.checksum] and codec > CODEC_ZSTD:
        raise ShardCorruptError(f"{path}: record {record} at byte {offset} names unknown codec "
                                f"{codec}", path=path, record=record, offset=offset)
    raise ShardCorruptError(
        f"{path}: record {record} at byte {offset} names checksum id {ident} (reserved bytes "
        f"{bytes(run.buffer[start + 10:start + 12]).hex()}) where the shard's {run.checksum} "
        f"is id {IDS[run.checksum]}; the shard is corrupt: restore it from a copy or re-pack",
        path=path, record=record, offset=offset,
    )


def tail_bytes(size: int, num_records: int, minimum: int = 0) -> int:
    """Bytes at the end of a ``.rec`` shard of ``size`` bytes and ``num_records`` records
    that hold its footer, index and keys, usually (the key block's length is known only
    from the footer): what a reader asks for before it has the footer. At least
    ``minimum``, at most ``size``."""
    want = FOOTER_SIZES[2] + INDEX_ENTRY_BYTES[2] * (num_records + 1) \
        + TAIL_GUESS_KEY_BYTES * num_records
    return min(size, max(minimum, want))


def pack_header(version: int = LAST_FRAMED_VERSION, checksum: str | None = None) -> bytes:
    """The header every ``.rec`` shard starts with (16 bytes in v1, 32 in v2)."""
    if version == 1:
        return HEADER.pack(SHARD_MAGIC, 1, 0)
    return HEADER_V2.pack(SHARD_MAGIC, version, 0, encode_name(checksum or DEFAULT))


@dataclass(frozen=True)
class Header:
    """What a shard header says: its version, the checksum its records use, its size."""

    version: int
    checksum: str
    size: int


def check_header(buf: bytes | memoryview, *, path: str) -> Header:
    """Refuse a file that is not a shardio shard of a known version; else what its header says.

    ``buf`` holds at least the file's first ``HEADER_SIZES[2]`` bytes (or all of a shorter file).
    """
    if len(buf) < HEADER_SIZE:
        raise TruncatedShardError(
            f"{path}: {len(buf)} bytes is too short for a shard header; re-pack it", path=path
        )
    magic, version, flags = HEADER.unpack_from(buf)
    if magic != SHARD_MAGIC:
        raise ShardCorruptError(
            f"{path}: not a shardio shard (magic {magic!r}, expected {SHARD_MAGIC!r})",
            path=path, offset=0,
        )
    _check_version(version, path)
    if flags != 0:
        # no version defines flags: a set bit is damage (or a newer writer), never something to skip
        raise ShardCorruptError(
            f"{path}: shard header flags are {flags:#010x}, format v{version} writes 0; the "
            "header is damaged: restore the shard from a copy or re-pack",
            path=path, offset=12,
        )
    if version == 1:
        return Header(1, CRC32, HEADER.size)
    if len(buf) < HEADER_V2.size:
        raise TruncatedShardError(
            f"{path}: {len(buf)} bytes is too short for a v2 shard header; re-pack it", path=path
        )
    raw = bytes(buf[16:24])
    name = decode_name(raw)
    if name is None or any(bytes(buf[24:32])):
        raise ShardCorruptError(
            f"{path}: the shard header names checksum {raw!r} (reserved bytes "
            f"{bytes(buf[24:32]).hex()}); known: {', '.join(NAMES)}. The header is damaged "
            "(or written by a newer shardio): restore the shard or upgrade shardio",
            path=path, offset=16,
        )
    return Header(version, name, HEADER_V2.size)


def pack_footer(index_offset: int, keys_offset: int, num_records: int, index_checksum: int,
                version: int = LAST_FRAMED_VERSION, checksum: str | None = None) -> bytes:
    """The fixed-size footer that ends every ``.rec`` shard."""
    if version == 1:
        return FOOTER.pack(index_offset, keys_offset, num_records, index_checksum, 1,
                           SHARD_MAGIC)
    return FOOTER_V2.pack(index_offset, keys_offset, num_records, index_checksum,
                          encode_name(checksum or DEFAULT), version, SHARD_MAGIC)


def unpack_footer(buf: bytes | memoryview, *, path: str, size: int | None = None) -> Footer:
    """Parse and sanity-check the footer from the last bytes of a shard.

    ``buf`` is the whole shard, or only its last bytes when ``size`` (the whole
    file's) is given: a remote reader fetches the tail alone.
    """
    size = len(buf) if size is None else size
    if size < HEADER_SIZE + FOOTER_SIZE or len(buf) < FOOTER_SIZE:
        raise TruncatedShardError(
            f"{path}: {size} bytes is too short for a shard; it is truncated, re-pack it",
            path=path,
        )
    version, magic = _TAIL.unpack_from(buf, len(buf) - _TAIL.size)
    if magic != SHARD_MAGIC:
        raise TruncatedShardError(
            f"{path}: no shard footer at byte {size - FOOTER_SIZE} (the file is truncated or "
            f"was not finished); re-pack it or run `shardio pack --resume`",
            path=path, offset=size - FOOTER_SIZE,
        )
    _check_version(version, path)
    footer_size = FOOTER_SIZES[version]
    if size < HEADER_SIZES[version] + footer_size or len(buf) < footer_size:
        raise TruncatedShardError(
            f"{path}: {size} bytes is too short for a v{version} shard; it is truncated, re-pack "
            "it", path=path,
        )
    at = len(buf) - footer_size
    if version == 1:
        index_offset, keys_offset, num_records, index_sum, _v, _m = FOOTER.unpack_from(buf, at)
        name: str | None = CRC32
    else:
        index_offset, keys_offset, num_records, index_sum, raw, _v, _m = FOOTER_V2.unpack_from(
            buf, at)
        name = decode_name(raw)
    index_end = index_offset + INDEX_ENTRY_BYTES[version] * (num_records + 1)
    if name is None or not (
        HEADER_SIZES[version] <= index_offset <= keys_offset <= size - footer_size
    ) or index_end != keys_offset:
        raise ShardCorruptError(
            f"{path}: footer offsets are inconsistent (index at {index_offset}, keys at "
            f"{keys_offset}, {num_records} records, checksum {name!r}, file of {size} bytes)",
            path=path, offset=size - footer_size,
        )
    return Footer(index_offset, keys_offset, num_records, index_sum, version, name, footer_size)


def parse_index(body: bytes | memoryview, footer: Footer, *, path: str) -> ShardIndex:
    """Check a shard's index and key block (the bytes from ``index_offset`` to the footer).

    Raises:
        ChecksumError: they fail the footer's checksum.
        ShardCorruptError: the offsets do not span the record area in increasing order.
    """
    import numpy as np

    view = memoryview(body)
    if checksum_function(footer.checksum)(view, 0) != footer.index_checksum:
        raise ChecksumError(
            f"{path}: the record index and key block (bytes {footer.index_offset}.."
            f"{footer.index_offset + len(view)}) fail their checksum (or the footer's copy of "
            "it is damaged); the shard is corrupt: restore it from a copy or re-pack",
            path=path, offset=footer.index_offset,
        )
    count = footer.num_records + 1
    offsets = np.frombuffer(view, dtype="<u8", count=count)
    chain = None if footer.version == 1 else np.frombuffer(view, "<u4", count, 8 * count)
    signed = offsets.astype(np.int64)
    if (count == 0 or int(offsets[0]) != HEADER_SIZES[footer.version]
            or int(offsets[-1]) != footer.index_offset or bool((np.diff(signed) < 0).any())):
        raise ShardCorruptError(
            f"{path}: record index does not span the record area in order; re-pack it",
            path=path, offset=footer.index_offset,
        )
    return ShardIndex(offsets, chain, view[footer.keys_offset - footer.index_offset:])


def _check_version(version: int, path: str) -> None:
    if version not in FRAMED_VERSIONS:
        raise UnsupportedVersionError(
            f"{path}: written by shardio format version {version}; this reader supports "
            f"{sorted(SUPPORTED_VERSIONS)}. Upgrade shardio to read it.",
            path=path,
        )
