"""One record under a new key: its msgpack map spliced, every other field's bytes kept.

A record stores its own ``__key__`` (readers check it against the shard's key
block), so giving a sample another key means rewriting its record. The
payload is a msgpack map; this module copies every entry but ``__key__`` byte
for byte and writes the new key in its place, so images and arrays are never
decoded or re-encoded. A payload the writer stored compressed (codec byte 1:
zstd, chosen only for records that are not already-compressed media) is
decompressed and compressed again, at the dataset's level. Torch-free.
"""

from __future__ import annotations

from typing import Final

import msgpack

from shardio.codecs import Codec, decompress
from shardio.errors import ShardCorruptError
from shardio.format import CODEC_NONE, frame, unframe
from shardio.record import KEY_FIELD

_PACKED_KEY_FIELD: Final = msgpack.packb(KEY_FIELD)


def rekey_frame(framed: memoryview | bytes, key: str, *, old_key: str, codec: Codec,
                path: str, record: int, offset: int) -> tuple[bytes, bool]:
    """The framed record ``framed`` with its ``__key__`` changed from ``old_key`` to ``key``.

    Args:
        framed: the record exactly as its shard delimits it.
        key: the new key.
        old_key: the key the shard's key block gives this record; the record must hold it.
        codec: compresses the new payload when the old one was compressed.
        path, record, offset: where the record is, for error messages.

    Returns:
        ``(new framed record, whether its payload was compressed again)``.

    Raises:
        ShardCorruptError: the frame fails its checksum, or the payload is not a
            map holding ``__key__`` equal to ``old_key``.
    """
    codec_id, stored = unframe(framed, path=path, record=record, offset=offset, verify=True,
                               exact=True)
    try:
        payload = _splice_key(bytes(decompress(codec_id, stored)), key, old_key)
    except Exception as exc:  # msgpack and zstd raise a zoo of types; map them here
        raise ShardCorruptError(
            f"{path}: record {record} at byte {offset} cannot be given a new key "
            f"({type(exc).__name__}: {exc}); run `shardio verify` on the input and restore "
            "or re-pack it", path=path, record=record, offset=offset) from exc
    if codec_id == CODEC_NONE:
        return frame(payload, CODEC_NONE), False
    new_id, new_stored = codec.compress(payload)
    return frame(new_stored, new_id), True


def _splice_key(payload: bytes, key: str, old_key: str) -> bytes:
    """``payload`` (a msgpack map) with the value of ``__key__`` replaced, the rest as it was."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(payload), 1))
    unpacker.feed(payload)
    size = unpacker.read_map_header()
    parts = [msgpack.Packer().pack_map_header(size)]
    found = False
    for _ in range(size):
        start = unpacker.tell()
        name = unpacker.unpack()
        if name == KEY_FIELD:
            value = unpacker.unpack()
            if value != old_key:
                raise ValueError(f"the record's key is {value!r}, the key block says {old_key!r}")
            parts += [_PACKED_KEY_FIELD, msgpack.packb(key)]
            found = True
        else:
            unpacker.skip()
            parts.append(payload[start:unpacker.tell()])
    if not found or unpacker.tell() != len(payload):
        raise ValueError("the payload is not one map holding __key__")
    return b"".join(parts)
