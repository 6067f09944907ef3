"""Reference reader of shardio format v3 shards (docs/format.md, §8), without shardio.

It exists to prove the spec complete: it reads a v3 ``.rec`` shard, or a v3 LMDB
shard, from the text of docs/format.md alone and yields each record's sample dict
(``__key__`` included), checking every checksum and every size the format bounds.
It needs the standard library, numpy and zstandard; msgpack only for msgpack
columns and the LMDB metadata entry, and the ``lmdb`` package only for LMDB shards.
The ``crc32c`` package, where installed, only makes the checksum faster.

Usage: ``python tools/read_v3.py SHARD`` prints one line per record.
"""

from __future__ import annotations

import struct
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import zstandard

MAGIC = b"SHARDIO\x00"
HEADER = struct.Struct("<8sII8s8x")  # magic, version, flags, checksum name, reserved
FOOTER = struct.Struct("<QQQQII8s")  # index, keys, records, blocks, crc32c, version, magic
KEYS_HEAD = struct.Struct("<BB6xQQ")  # codec, offset width, data stored, data raw
BLOCK_HEAD = struct.Struct("<IIQIIQ")  # crc32c, records, first record, columns, table, size
ENTRY = struct.Struct("<BBBBQQH")  # kind, codec, flags, width, stored, raw, name length
BYTES, STR, INT, MSGPACK = 0, 1, 2, 3
MAX_INFLATE_RATIO = 1024


class FormatError(ValueError):
    """The shard breaks a rule of the format."""


def need(ok: bool, what: str) -> None:
    if not ok:
        raise FormatError(what)


def _table() -> list[int]:
    poly, out = 0x82F63B78, []  # CRC-32C (Castagnoli), reflected
    for n in range(256):
        for _ in range(8):
            n = (n >> 1) ^ poly if n & 1 else n >> 1
        out.append(n)
    return out


_CRC_TABLE = _table()


def crc32c(data: bytes | memoryview) -> int:
    """CRC-32C of ``data`` (initial value and final XOR 0xFFFFFFFF)."""
    try:
        import crc32c as fast  # optional: the same function in C
        return int(fast.crc32c(data))
    except ImportError:
        pass
    crc, table = 0xFFFFFFFF, _CRC_TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def inflate(stored: memoryview, raw: int) -> bytes:
    """A zstd frame inflated to exactly ``raw`` bytes, its size checked before allocating."""
    need(len(stored) > 0 and raw <= len(stored) * MAX_INFLATE_RATIO, "inflate ratio too high")
    need(zstandard.frame_content_size(stored) == raw, "zstd frame size differs from the table")
    out = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw)
    need(len(out) == raw, "zstd frame inflated to the wrong size")
    return bytes(out)


def values(raw: memoryview, kind: int, flags: int, width: int, count: int) -> list[Any]:
    """A raw column's ``count`` values; a missing one is the ``MISSING`` object."""
    at, present = 0, [True] * count
    need(len(raw) >= ((count + 7) // 8 if flags else 0)
         + width * (count if kind == INT else count + 1), "column too short for its records")
    if flags & 1:
        bits = np.unpackbits(np.frombuffer(raw, np.uint8, (count + 7) // 8), bitorder="little")
        need(not bits[count:].any() and 0 < bits[:count].sum() < count, "bad presence bitmap")
        present, at = bits[:count].astype(bool).tolist(), (count + 7) // 8
    if kind == INT:
        need(len(raw) == at + width * count, "int column of the wrong size")
        ints = np.frombuffer(raw, f"<i{width}", count, at).tolist()
        need(all(p or v == 0 for p, v in zip(present, ints, strict=True)),
             "value for a missing field")
        return [v if p else MISSING for p, v in zip(present, ints, strict=True)]
    ends = np.frombuffer(raw, f"<u{width}", count + 1, at).astype(np.int64).tolist()
    data = raw[at + width * (count + 1):]
    need(ends[0] == 0 and ends[-1] == len(data) and bool((np.diff(ends) >= 0).all()),
         "offsets out of order")
    out: list[Any] = []
    for i, p in enumerate(present):  # one value at a time: a reference, not fast
        piece = data[ends[i]:ends[i + 1]]
        need(p or not piece, "bytes for a missing field")
        if not p:
            out.append(MISSING)
        elif kind == BYTES:
            out.append(bytes(piece))
        elif kind == STR:
            out.append(str(piece, "utf-8"))
        else:
            out.append(unpack_msgpack(piece))
    return out


MISSING = object()


def unpack_msgpack(piece: memoryview) -> Any:
    import msgpack

    def ext(code: int, data: bytes) -> Any:  # ext type 1: [dtype, shape, C-order bytes]
        need(code == 1, f"unknown msgpack extension {code}")
        dtype, shape, raw = msgpack.unpackb(data, raw=False)
        return np.frombuffer(raw, np.dtype(dtype)).reshape(shape)

    return msgpack.unpackb(piece, raw=False, ext_hook=ext, strict_map_key=True)


def read_block(block: memoryview, first: int, count: int) -> list[dict[str, Any]]:
    """The samples (without keys) of a block the index says holds ``first..first+count``."""
    need(len(block) >= BLOCK_HEAD.size, "block shorter than its head")
    crc, records, start, columns, table, size = BLOCK_HEAD.unpack_from(block)
    need(crc32c(block[4:]) == crc, "block checksum fails")
    need(size == len(block) and records == count and start == first, "block head disagrees")
    need(table <= size - BLOCK_HEAD.size and columns * ENTRY.size <= table, "table too large")
    samples: list[dict[str, Any]] = [{} for _ in range(count)]
    seen = {"", "__key__", "__index__"}
    at, data_at = BLOCK_HEAD.size, BLOCK_HEAD.size + table
    for _ in range(columns):
        need(at + ENTRY.size <= BLOCK_HEAD.size + table, "table cut short")
        kind, codec, flags, width, stored, raw, name_len = ENTRY.unpack_from(block, at)
        name = str(block[at + ENTRY.size:at + ENTRY.size + name_len], "utf-8")
        at += ENTRY.size + name_len
        need(at <= BLOCK_HEAD.size + table and stored <= size - data_at, "column runs past block")
        need(kind <= 3 and codec <= 1 and flags <= 1 and name not in seen, "bad entry")
        seen.add(name)
        need(width in ((1, 2, 4, 8) if kind == INT else (4, 8)), "bad width")
        body = block[data_at:data_at + stored]
        need(codec == 1 or raw == stored, "raw column size disagrees")
        column = memoryview(inflate(body, raw)) if codec else body
        for sample, value in zip(samples, values(column, kind, flags, width, count), strict=True):
            if value is not MISSING:
                sample[name] = value
        data_at += stored
    need(at == BLOCK_HEAD.size + table and data_at == size, "columns do not fill the block")
    return samples


def read_keys(section: memoryview, count: int) -> list[str]:
    need(len(section) >= KEYS_HEAD.size, "key section too short")
    codec, width, stored, raw = KEYS_HEAD.unpack_from(section)
    split = KEYS_HEAD.size + width * (count + 1)
    need(width in (4, 8) and split + stored == len(section), "key section sizes disagree")
    need(codec == 1 or raw == stored, "raw key size disagrees")
    data = inflate(section[split:], raw) if codec else bytes(section[split:])
    return values(memoryview(bytes(section[KEYS_HEAD.size:split]) + data), STR, 0, width, count)


def read_rec(buf: memoryview) -> Iterator[dict[str, Any]]:
    size = len(buf)
    need(size >= HEADER.size + FOOTER.size, "file too short")
    magic, version, flags, name = HEADER.unpack_from(buf)
    need(magic == MAGIC and version == 3 and flags == 0 and name == b"crc32c\0\0", "not v3")
    need(not any(buf[24:32]), "reserved header bytes are not zero")
    index, keys_at, count, blocks, crc, version, magic = FOOTER.unpack_from(buf, size - FOOTER.size)
    need(magic == MAGIC and version == 3, "no v3 footer (truncated?)")
    need(HEADER.size + BLOCK_HEAD.size * blocks <= index and keys_at == index + 16 * (blocks + 1)
         and keys_at + KEYS_HEAD.size + 4 * (count + 1) <= size - FOOTER.size, "bad footer")
    need(crc32c(buf[index:size - FOOTER.size]) == crc, "index and keys fail their checksum")
    offsets = np.frombuffer(buf, "<u8", blocks + 1, index).astype(np.int64).tolist()
    first = np.frombuffer(buf, "<u8", blocks + 1, index + 8 * (blocks + 1)).astype(np.int64)
    need(offsets[0] == HEADER.size and offsets[-1] == index, "block offsets do not span blocks")
    yield from _records(first.tolist(), read_keys(buf[keys_at:size - FOOTER.size], count),
                        lambda b: buf[offsets[b]:offsets[b + 1]])


def _records(first: list[int], keys: list[str], block_of: Any) -> Iterator[dict[str, Any]]:
    need(first[0] == 0 and first[-1] == len(keys)
         and bool((np.diff(first) > 0).all()), "block index out of order")
    for b in range(len(first) - 1):
        samples = read_block(memoryview(block_of(b)), first[b], first[b + 1] - first[b])
        for k, sample in enumerate(samples):
            yield {"__key__": keys[first[b] + k], **sample}


def read_lmdb(path: str) -> Iterator[dict[str, Any]]:
    import lmdb
    import msgpack

    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta = msgpack.unpackb(txn.get(b"__shardio__"), raw=False)
            need(meta.get("version") == 3 and meta.get("checksum") == "crc32c", "not v3")
            index, keys = txn.get(b"__shardio_index__"), txn.get(b"__shardio_keys__")
            blocks = meta["num_blocks"]
            need(env.stat()["entries"] == blocks + 3, "entry count disagrees")
            need(len(index) == 8 * (blocks + 1) and crc32c(index) == meta["index_crc32c"],
                 "index fails its size or checksum")
            need(len(keys) == meta["keys_bytes"] and zlib.crc32(keys) == meta["keys_crc32"],
                 "key section fails its size or checksum")
            first = np.frombuffer(index, "<u8").astype(np.int64).tolist()
            names = read_keys(memoryview(keys), meta["num_records"])

            def block_of(b: int) -> bytes:
                value = txn.get(b.to_bytes(8, "big"))
                need(value is not None, f"block {b} missing")
                return bytes(value)

            yield from _records(first, names, block_of)
    finally:
        env.close()


def read_shard(path: str) -> Iterator[dict[str, Any]]:
    """Every record of the v3 shard at ``path`` (``.rec`` or LMDB), as a sample dict."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:8] == MAGIC:
        yield from read_rec(memoryview(data))
    else:
        yield from read_lmdb(path)


if __name__ == "__main__":
    for sample in read_shard(sys.argv[1]):
        print({k: (f"<{len(v)} bytes>" if isinstance(v, bytes) else v) for k, v in sample.items()})
