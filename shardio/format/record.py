"""Samples ↔ record payloads: msgpack with one extension type for numpy arrays.

A sample is a mapping of field name to value. Values may be bytes, str, int,
float, bool, None, lists and dicts of those, and numpy arrays of a plain dtype
(kept with dtype and shape). Anything else is refused with a
``RecordEncodeError``: nothing is ever pickled or unpickled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgpack
import numpy as np

from shardio.errors import RecordEncodeError, ShardCorruptError
from shardio.format.checksum import DEFAULT, NAMES
from shardio.format.codecs import Codec, decompress, decompressor, looks_compressed
from shardio.format.frames import CODEC_NONE, FRAME_SIZE, RunBytes, check_frames, frame, unframe

KEY_FIELD: Final = "__key__"
INDEX_FIELD: Final = "__index__"
SOURCE_FIELD: Final = "__source__"
"""Set by readers of a mixture to the sample's source, so no stored field may use it."""
EXT_NDARRAY: Final = 1
"""msgpack ext type 1: an ndarray as msgpack ``[dtype.str, shape, raw C-order bytes]``."""


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.fields is not None:
            raise RecordEncodeError(
                f"numpy arrays of dtype {value.dtype} cannot be stored without pickle; "
                "convert to a plain numeric dtype"
            )
        body = msgpack.packb(
            [value.dtype.str, list(value.shape), np.ascontiguousarray(value).tobytes()],
            use_bin_type=True,
        )
        return msgpack.ExtType(EXT_NDARRAY, body)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, tuple):
        return list(value)
    raise RecordEncodeError(
        f"cannot store a value of type {type(value).__name__}: records hold bytes, str, int, "
        "float, bool, None, lists, dicts and numpy arrays (nothing is pickled)"
    )


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_NDARRAY:
        dtype, shape, raw = msgpack.unpackb(data, raw=False)
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)
    raise ValueError(f"unknown msgpack extension type {code}")


def _check_map_keys(value: list[Any] | tuple[Any, ...] | dict[Any, Any], field: str) -> None:
    """Refuse a dict with a non-str key anywhere in ``value``: its record would not decode."""
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise RecordEncodeError(
                    f"field {field!r}: dict keys must be str, got {key!r} "
                    f"({type(key).__name__}); convert the keys to str"
                )
    for item in items:
        if isinstance(item, (dict, list, tuple)):
            _check_map_keys(item, field)


def encode_sample(sample: Mapping[str, Any]) -> bytes:
    """Serialize one sample to its msgpack payload (before compression)."""
    for name, value in sample.items():
        if not isinstance(name, str):
            raise RecordEncodeError(f"field names must be str, got {name!r}")
        if isinstance(value, (dict, list, tuple)):
            _check_map_keys(value, name)
    try:
        return msgpack.packb(dict(sample), default=_default, use_bin_type=True, strict_types=False)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, RecordEncodeError):
            raise
        raise RecordEncodeError(f"cannot encode sample: {exc}") from exc


def decode_payload(payload: bytes | memoryview) -> dict[str, Any]:
    """Parse a msgpack payload back into the sample dict."""
    value = msgpack.unpackb(payload, raw=False, ext_hook=_ext_hook, strict_map_key=True)
    if not isinstance(value, dict):
        raise ValueError(f"payload is a {type(value).__name__}, not a map")
    return value


def mostly_compressed(sample: Mapping[str, Any]) -> bool:
    """Whether most of a sample's bytes are already-compressed media (JPEG, PNG, …)."""
    total = 0
    packed = 0
    for value in sample.values():
        if isinstance(value, (bytes, bytearray, memoryview)):
            total += len(value)
            if looks_compressed(value):
                packed += len(value)
    return total > 0 and packed * 2 >= total


def encode_record(sample: Mapping[str, Any], codec: Codec, checksum: str = DEFAULT) -> bytes:
    """Encode, compress where it pays, and frame one sample (with ``checksum``, by name)."""
    payload = encode_sample(sample)
    if mostly_compressed(sample):
        return frame(payload, CODEC_NONE, checksum)
    codec_id, stored = codec.compress(payload)
    return frame(stored, codec_id, checksum)


def decode_run(
    run: RunBytes, *, path: str, first_record: int, offset_of: Callable[[int], int] | None = None,
    verify: bool = True, first_index: int | None = None,
    keys: Sequence[str] | None = None, only: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Check and decode a run of consecutive v1/v2 records into sample dicts.

    The frames are checked together by ``shardio.format.frames.check_frames`` (one
    checksum call for a v2 ``.rec`` run); then each payload is decompressed
    where its codec says so and parsed in one tight loop. ``offset_of(record)``
    gives a record's byte offset, for error messages only. With
    ``first_index`` each sample gets its global ``__index__`` too. With
    ``keys`` (the shard's key block), each record's own ``__key__`` must be
    the block's key for its position, so that a damaged
    index or B-tree leading to another intact record is an error, not the
    wrong sample. With ``only`` (ascending positions in the run), only those
    records are decoded: a reader that wants a scattered part of a block reads
    it as one run (every record is still checked) instead of many short ones.
    """
    codecs = check_frames(run, path=path, first_record=first_record, verify=verify,
                          offset_of=offset_of)
    buf, bounds = run.buffer, run.bounds.tolist()
    out: list[dict[str, Any]] = []
    unpackb = msgpack.unpackb
    inflate = decompressor().decompress
    expected = keys[first_record : first_record + len(codecs)] if keys is not None else None
    for n in range(len(codecs)) if only is None else only:
        codec = codecs[n]
        payload = buf[bounds[n] + FRAME_SIZE : bounds[n + 1]]
        try:
            data = inflate(payload) if codec else payload
            sample = unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=True)
            if not isinstance(sample, dict):
                raise ValueError(f"payload is a {type(sample).__name__}, not a map")
        except Exception as exc:  # msgpack and zstd raise a zoo of types; map them here
            raise _undecodable(path, first_record + n, _where(run, n, offset_of, first_record),
                               exc) from exc
        if expected is not None and sample.get(KEY_FIELD) != expected[n]:
            raise _wrong_key(path, first_record + n, _where(run, n, offset_of, first_record),
                             sample.get(KEY_FIELD), expected[n])
        if first_index is not None:
            sample[INDEX_FIELD] = first_index + n
        out.append(sample)
    return out


def _where(run: RunBytes, n: int, offset_of: Callable[[int], int] | None, first: int) -> int:
    return offset_of(first + n) if offset_of is not None else run.offset + int(run.bounds[n])


def decode_frames(
    frames: Sequence[memoryview], *, path: str, first_record: int,
    offset_of: Callable[[int], int], verify: bool = True, first_index: int | None = None,
    keys: Sequence[str] | None = None, checksum: str | None = None,
) -> list[dict[str, Any]]:
    """``decode_run`` over frames held apart (joined into one buffer first).

    ``checksum``: the shard's; default, the one the first frame names.
    """
    if not frames:
        return []
    sizes = np.fromiter(map(len, frames), np.int64, len(frames))
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    name = checksum
    if name is None:
        ident = frames[0][9] if len(frames[0]) >= FRAME_SIZE else 0
        name = NAMES[ident] if ident < len(NAMES) else f"id {ident}"
    run = RunBytes(memoryview(b"".join(frames)), bounds, name, None, -1)
    return decode_run(run, path=path, first_record=first_record, offset_of=offset_of,
                      verify=verify, first_index=first_index, keys=keys)


def _undecodable(path: str, record: int, offset: int, exc: Exception) -> ShardCorruptError:
    return ShardCorruptError(
        f"{path}: record {record} at byte {offset} passed its checksum but does not "
        f"decode ({type(exc).__name__}: {exc}); the shard was written by a broken writer",
        path=path, record=record, offset=offset,
    )


def _wrong_key(path: str, record: int, offset: int, found: Any, expected: str) -> ShardCorruptError:
    return ShardCorruptError(
        f"{path}: record {record} at byte {offset} holds key {found!r} but the shard's key "
        f"block says {expected!r}; the shard is corrupt or was altered: restore it from a "
        "copy or re-pack",
        path=path, record=record, offset=offset,
    )


def decode_record(
    buf: bytes | memoryview, *, path: str, record: int, offset: int = 0, verify: bool = True,
    key: str | None = None, checksum: str | None = None,
) -> dict[str, Any]:
    """Check, decompress and parse one framed record into its sample dict.

    ``buf`` is exactly the record as its shard delimits it. With ``key`` (the
    key block's entry for ``record``) the record's own ``__key__`` must match;
    with ``checksum`` (the shard's) the frame must name it.
    """
    codec_id, stored = unframe(
        buf, path=path, record=record, offset=offset, verify=verify, exact=True,
        checksum=checksum,
    )
    try:
        sample = decode_payload(decompress(codec_id, stored))
    except Exception as exc:  # msgpack and zstd raise a zoo of types; map them at this boundary
        raise _undecodable(path, record, offset, exc) from exc
    if key is not None and sample.get(KEY_FIELD) != key:
        raise _wrong_key(path, record, offset, sample.get(KEY_FIELD), key)
    return sample
