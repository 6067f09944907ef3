"""Decoded v3 blocks kept per reader, so that random reads pay for a block once.

A map-style read (``IndexedDataset``, ``DatasetReader.get``) wants one record of a
block, but the block is the unit that is checked and inflated (docs/format.md, §8).
Read, checked and decoded for every ``ds[i]``, random access ran at 0.03 to 0.23 times a
single LMDB file (``git show 5cead40:benchmarks/results/2026-11-28-quick-shapes.json``).
Kept decoded here, bounded in bytes and least recently used first out, a block is read,
checked and inflated when a read first needs it, and later reads of its records cut
their fields from its columns: with 512 KiB blocks a first random epoch then runs at
0.52 (images) and 0.57 (10^5 tiny samples) times the LMDB file, a second at 1.15 and
0.92 (``python -m benchmarks.bench_warm --images 4000 --rounds 5``,
``benchmarks/results/warm.json``). A block is checked when it enters the cache, not at
every read of it.
Torch-free.
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy.typing as npt

from shardio.format.block import BYTES, RAW, BlockHead, Column, decode_columns, read_head
from shardio.format.frames import RunBytes, check_frames
from shardio.format.record import KEY_FIELD

DEFAULT_CACHE_BYTES: Final = 512 << 20
"""Decoded blocks a reader keeps by default, in each process that reads: their unpacked
bytes where compressed (a raw column of a mapped file costs only the page cache). Random
reads over more than this decode about one block a sample; a smaller budget trades that
for memory."""
RECORD_OVERHEAD: Final = 16
"""Bytes each record of each column is counted for beyond its data (its offset)."""


class DecodedBlock:
    """One checked block's columns, ready to cut any of its records into a sample dict."""

    __slots__ = ("block", "columns", "cost", "keys", "path")

    def __init__(self, run: RunBytes, keys: Sequence[str], *, path: str, verify: bool,
                 parts: BlockParts | None = None) -> None:
        """Check and decode the single block ``run`` holds (``read_run`` of its records),
        whose records' keys are ``keys``; ``parts``: ``block_parts`` of it, made already."""
        head, columns = parts or block_parts(run, path=path, verify=verify)
        count = head.num_records
        # a raw column of a mapped file is a view of the map: it costs the page cache, not
        # this process's memory
        private = not _is_mapped(run)
        self.keys = keys
        self.cost = sum(RECORD_OVERHEAD * count + (
            len(c.data) if c.data is not None and (private or e.codec != RAW) else 0)
            for c, e in zip(columns, head.columns, strict=True))
        self.path, self.block = path, run.first_block
        # lists, not arrays: a record's fields are then a few list lookups
        self.columns = [(c.name, c.kind == BYTES, _listed(c.present), _listed(c.offsets),
                         _listed(c.ints), c) for c in columns]

    def sample(self, position: int) -> dict[str, Any]:
        """The block's record ``position`` as a sample dict with its ``__key__`` (bytes
        values are copies)."""
        out: dict[str, Any] = {KEY_FIELD: self.keys[position]}
        for name, is_bytes, present, offsets, ints, column in self.columns:
            if present is not None and not present[position]:
                continue
            if ints is not None:
                out[name] = ints[position]
            elif is_bytes:
                assert column.data is not None and offsets is not None
                out[name] = bytes(column.data[offsets[position] : offsets[position + 1]])
            else:
                out[name] = column.value(position, path=self.path, block=self.block)
        return out


BlockParts = tuple[BlockHead, list[Column]]


def block_parts(run: RunBytes, *, path: str, verify: bool) -> BlockParts:
    """The head and columns (inflated) of the single block ``run`` holds, checked first
    with ``verify``: what a ``DecodedBlock`` is made of, in one call that a thread can
    make ahead of the reader (``DatasetReader.get_many``), as zstd and CRC-32C release
    the interpreter's lock."""
    assert run.blocks is not None and len(run.blocks) == 2, "one v3 block"
    check_frames(run, path=path, first_record=int(run.blocks[0]), verify=verify)
    first, count = int(run.blocks[0]), int(run.blocks[1] - run.blocks[0])
    head = read_head(run.buffer, path=path, block=run.first_block, first_record=first,
                     num_records=count)
    return head, decode_columns(run.buffer, head, path=path, block=run.first_block)


class BlockCache:
    """Decoded blocks by ``(shard, block)``, at most ``budget`` bytes, least recent out first."""

    def __init__(self, budget: int = DEFAULT_CACHE_BYTES) -> None:
        self.budget = budget
        self._blocks: OrderedDict[tuple[int, int], DecodedBlock] = OrderedDict()
        self._held = 0

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._blocks

    def get(self, shard: int, block: int, load: Callable[[], DecodedBlock]) -> DecodedBlock:
        """Block ``block`` of ``shard``, decoded by ``load`` unless kept."""
        key = (shard, block)
        found = self._blocks.get(key)
        if found is not None:
            self._blocks.move_to_end(key)
            return found
        found = load()
        if found.cost <= self.budget:
            self._blocks[key] = found
            self._held += found.cost
            while self._held > self.budget:
                self._held -= self._blocks.popitem(last=False)[1].cost
        return found

    def drop_shard(self, shard: int) -> None:
        """Forget ``shard``'s blocks (before its file is closed: they may be views of it)."""
        for key in [k for k in self._blocks if k[0] == shard]:
            self._held -= self._blocks.pop(key).cost

    def clear(self) -> None:
        """Forget every block."""
        self._blocks.clear()
        self._held = 0


def _is_mapped(run: RunBytes) -> bool:
    return isinstance(run.buffer.obj, mmap.mmap)


def _listed(array: npt.NDArray[Any] | None) -> list[Any] | None:
    return None if array is None else array.tolist()
