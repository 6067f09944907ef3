"""A window's runs of many shards decoded in one pass, from the edges of their records.

``columnar.decode_columns`` decodes one shard's runs of a window with a few dozen
numpy calls, whatever their number of records. A window of 80 KB images holds
only a few dozen records of each of its shards, so those fixed costs came to
about 3 us an image, the largest cost of a warm image epoch left on the reading
thread. Parsing needs only a record's small fields, and in the maps a pack
writes those lie near either end of the record (a key and a label before or
after the image), so ``decode_window`` gathers each record's first and last
bytes shard by shard, one gather each, and parses every shard's records at once
from those (``runfields.parse_edges``): frame headers, field names, kinds,
lengths, and keys compared with the shards' key blocks, as ``decode_columns``
checks them. It gives ``decode_columns``'s result for every shard, or None (a
value in neither edge, shards of different shapes, a key that does not match,
runs that are not views of one map each, ...), and the caller decodes shard by
shard, where anything wrong gets its name.

It pays on windows of many records a shard too (the tiny tree's, about 960): there it
was slower than shard by shard while each bytes value of inflated payloads was copied
out, and is faster since they are views (``shardio.inflatepool``; the stage table of
``benchmarks/bench_stages.py`` has both). Torch-free.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardio import inflatepool
from shardio.columnar import (
    Columns,
    IndexArray,
    RunPart,
    buffer_positions,
    expected_keys,
    file_column,
    inflated_payloads,
)
from shardio.format import FRAME_SIZE, header_codecs
from shardio.record import INDEX_FIELD, KEY_FIELD
from shardio.runfields import INT, STR, Column, Edges, parse_edges

HEAD_BYTES = 128
"""Bytes gathered from the start of each record's payload: the map's first fields (a key
of up to about 100 bytes, the header of a large value)."""
TAIL_BYTES = 32
"""Bytes gathered from the end of each record: the fields after a large value (a label)."""

UInt8Array = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class ShardRuns:
    """One shard's runs of a window, checked (``RunPart.checked``) where they are verified."""

    parts: Sequence[RunPart]
    keys: Sequence[str]
    """The shard's key block."""


@dataclass
class _Gathered:
    """One shard's wanted records, as ``decode_window`` reads them."""

    data: Any
    """What the values are cut from: the shard's map (a memoryview) or its inflated payloads."""
    source: object
    """The map the values are views of (None: of the inflated payloads)."""
    starts: IndexArray
    """Where each wanted record's payload starts in ``data``."""
    heads: UInt8Array
    tails: UInt8Array
    lengths: IndexArray
    keys: list[str]
    held: io.BytesIO | None = None
    """The ``shardio.inflatepool`` buffer of the inflated payloads (None: mapped)."""


def decode_window(shards: Sequence[ShardRuns]) -> list[Columns] | None:
    """``decode_columns`` of every shard in ``shards``, from one parse of their records.

    The runs' checksums must have been checked (or not be verified): only frame headers
    are checked here. None where the records are not all flat maps of one shape with
    the keys of their shards' key blocks within reach of the edges gathered.
    """
    if not shards or len({part.run.checksum for s in shards for part in s.parts}) != 1:
        return None
    checksum = shards[0].parts[0].run.checksum
    gathered: list[_Gathered] = []
    out: list[Columns] | None = None
    try:
        out = _decode(shards, checksum, gathered)
    finally:
        if out is None:  # nothing is cut from the inflated payloads: their buffers are free
            inflatepool.give_back([g.held for g in gathered if g.held is not None])
    return out


def _decode(shards: Sequence[ShardRuns], checksum: str, gathered: list[_Gathered]
            ) -> list[Columns] | None:
    """``decode_window``, each shard's gathered records appended to ``gathered``."""
    for shard in shards:
        got = _gather(shard, checksum)
        if got is None:
            return None
        gathered.append(got)
    edges = Edges(np.concatenate([g.heads for g in gathered]),
                  np.concatenate([g.tails for g in gathered]),
                  np.concatenate([g.lengths for g in gathered]))
    maps = parse_edges(edges)
    if maps is None or KEY_FIELD not in maps.names or INDEX_FIELD in maps.names:
        return None
    key_column = maps.columns[maps.names.index(KEY_FIELD)]
    keys = [key for g in gathered for key in g.keys]
    if key_column.kind != STR or not _same_keys(edges, key_column.starts, key_column.ends,
                                                keys):
        return None
    bounds = np.cumsum([0] + [len(g.lengths) for g in gathered]).tolist()
    payload = np.concatenate([g.starts for g in gathered])
    out = [Columns(g.keys, [], [], [], [], source=g.source,
                   buffers=[] if g.held is None else [g.held]) for g in gathered]
    try:
        for name, column in zip(maps.names, maps.columns, strict=True):
            if name == KEY_FIELD:
                continue
            starts = ends = None
            if column.kind != INT:
                assert column.starts is not None and column.ends is not None
                starts, ends = column.starts + payload, column.ends + payload
            for k, g in enumerate(gathered):
                lo, hi = bounds[k], bounds[k + 1]
                file_column(out[k], name, Column(
                    column.kind, None if starts is None else starts[lo:hi],
                    None if ends is None else ends[lo:hi],
                    None if column.ints is None else column.ints[lo:hi]), g.data)
    except UnicodeDecodeError:  # a str field that is not UTF-8: decode_run names the record
        return None
    return out


def _gather(shard: ShardRuns, checksum: str) -> _Gathered | None:
    """The edges of one shard's wanted records, its frame headers checked (None: one failed,
    the runs are not views of one map, or a record's edges do not lie in its buffer)."""
    parts = shard.parts
    base = parts[0].run.buffer.obj
    at = buffer_positions(parts, base)
    if at is None:
        return None
    data = np.frombuffer(base, np.uint8)  # type: ignore[call-overload]
    if len(parts) == 1:
        frames, sizes = at[0] + parts[0].run.bounds[:-1], np.diff(parts[0].run.bounds)
    else:
        frames = np.concatenate([a + part.run.bounds[:-1]
                                 for a, part in zip(at, parts, strict=True)])
        sizes = np.concatenate([np.diff(part.run.bounds) for part in parts])
    if len(frames) == 0 or int((frames + sizes).max()) > len(data):
        return None
    # every frame's header and the first bytes of its payload, in one gather
    heads = _rows(data, frames, FRAME_SIZE + HEAD_BYTES)
    if heads is None:
        return None
    codecs = header_codecs(heads, sizes, checksum)
    if codecs is None:  # a damaged header: decode_columns names it
        return None
    counts = [len(part.run.bounds) - 1 for part in parts]
    positions = [np.arange(count) if part.only is None else np.asarray(part.only, np.int64)
                 for count, part in zip(counts, parts, strict=True)]
    keys = expected_keys(shard.keys, parts, positions)
    wanted = None
    if any(part.only is not None for part in parts):
        firsts = np.cumsum([0, *counts[:-1]]).tolist()
        wanted = np.concatenate([first + pos for first, pos in zip(firsts, positions,
                                                                   strict=True)])
    if not bool(codecs.any()):  # every payload is a slice of one map: read in place
        if wanted is not None:
            frames, sizes, heads = frames[wanted], sizes[wanted], heads[wanted]
        starts, ends = frames + FRAME_SIZE, frames + sizes
        tails = _rows(data, ends - TAIL_BYTES, TAIL_BYTES)
        if tails is None:
            return None
        return _Gathered(memoryview(base), base, starts, heads[:, FRAME_SIZE:], tails,
                         sizes - FRAME_SIZE, keys)
    # padded so that the first and last records' edges lie in it too
    blob, starts, ends, held = inflated_payloads(parts, pad=max(HEAD_BYTES, TAIL_BYTES))
    if blob is None:
        return None
    inflated = np.frombuffer(blob, np.uint8)
    front = _rows(inflated, starts, HEAD_BYTES)
    back = _rows(inflated, ends - TAIL_BYTES, TAIL_BYTES)
    if front is None or back is None:
        del inflated, blob
        inflatepool.give_back([] if held is None else [held])
        return None
    return _Gathered(blob, None, starts, front, back, ends - starts, keys, held)


def _rows(data: UInt8Array, at: IndexArray, width: int) -> UInt8Array | None:
    """The ``width`` bytes of ``data`` from each of ``at``, one row each (None: one does not
    lie in ``data``). Rows of a strided view are copied whole, not byte by byte."""
    if len(data) < width or int(at.min()) < 0 or int(at.max()) > len(data) - width:
        return None
    view = np.lib.stride_tricks.as_strided(data, (len(data) - width + 1, width), (1, 1),
                                           writeable=False)
    got: UInt8Array = view[at]
    return got


def _same_keys(edges: Edges, starts: IndexArray | None, ends: IndexArray | None,
               expected: list[str]) -> bool:
    """Whether each record's ``__key__`` bytes, within its heads, are those of its key in
    its shard's key block."""
    assert starts is not None and ends is not None
    joined = "".join(expected)
    if not joined.isascii():  # lengths in characters are not lengths in bytes
        return False
    lengths = np.fromiter(map(len, expected), np.int64, len(expected))
    if not np.array_equal(ends - starts, lengths) or int(ends.max()) > HEAD_BYTES:
        return False
    width = int(lengths.max())
    if width == 0:
        return True
    # each key's bytes and those after it, up to the longest key's length, side by side
    heads = np.ascontiguousarray(edges.heads)
    flat = np.concatenate([heads.reshape(-1), np.zeros(width, np.uint8)])
    got = _rows(flat, np.arange(len(lengths)) * heads.shape[1] + starts, width)
    text = np.frombuffer(joined.encode("ascii") + bytes(width), np.uint8)
    want = _rows(text, np.cumsum(lengths) - lengths, width)
    assert got is not None and want is not None  # both lie in their buffers
    return bool(((got == want) | (np.arange(width) >= lengths[:, None])).all())
