"""Check an LMDB shard's page structure before liblmdb maps it.

liblmdb trusts the file: it maps it and follows page numbers and value sizes
without checking them against the file's end, so one flipped bit in a B-tree
page (a value size, an overflow page number, a child page number) makes it
read past the end of the file and the process dies by SIGBUS. This module
reads page headers and B-tree pages with ``os.pread`` (a short read is an
error, never a signal) and proves that every page a read transaction can
reach lies inside the file, once, before ``shardio.backends.lmdb`` opens it:

* the meta page liblmdb will use (the higher ``txnid`` of pages 0 and 1): magic
  ``0xBEEFC0DE``, data version 1, a power-of-two page size, ``last_pgno``
  inside the file, sane root page numbers and depth;
* from the main database's root, every branch and leaf page once (no loops, no
  shared pages): header page number and flags, ``lower``/``upper`` bounds,
  every node inside its page, keys strictly increasing and inside the range
  their parent branch routes to them, branch pages with at least two children;
* every leaf value: inline values end inside their page; a big value's run of
  ``ceil((16 + size) / psize)`` overflow pages lies inside the file and overlaps
  no other page (with ``overflow_headers=True`` its ``P_OVERFLOW`` header is read
  too: liblmdb's read path never uses it, and cold it costs a random read);
* the page, entry and depth counts the meta page holds match the tree.

Walking every leaf, the check also finds where each value lies in the file
(``LmdbLayout.numbered`` and ``named``): ``shardio.backends.lmdb`` reads values
from its own map of the file at those places, so liblmdb only ever writes shards.

The free-page database is only read by write transactions, which shardio never
starts on a shard, so only its root number is checked. The layout is liblmdb's
(``mdb.c``, data version 1) on 64-bit platforms: 16-byte page headers, 8-byte
page numbers, native byte order. Imports only ``errors`` from shardio.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from shardio.errors import ShardCorruptError, TruncatedShardError, UnsupportedVersionError

MAGIC: Final = 0xBEEFC0DE
DATA_VERSION: Final = 1
PAGE_HEADER_BYTES: Final = 16
NODE_HEADER_BYTES: Final = 8
MIN_PAGE_BYTES: Final = 512
MAX_PAGE_BYTES: Final = 0x8000
"""liblmdb's MAX_PAGESIZE without PAGEBASE."""
MAX_DEPTH: Final = 32
"""liblmdb's CURSOR_STACK: a deeper tree is refused by liblmdb too."""
NO_PAGE: Final = (1 << 64) - 1
"""P_INVALID, the root of an empty database."""

P_BRANCH: Final = 0x01
P_LEAF: Final = 0x02
P_OVERFLOW: Final = 0x04
P_META: Final = 0x08
F_BIGDATA: Final = 0x01

PAGE_HEADER = struct.Struct("=QHHHH")
"""pgno, pad, flags, lower, upper (overflow pages: lower | upper << 16 is the page count)."""
OVERFLOW_HEADER = struct.Struct("=QHHI")
NODE_HEADER = struct.Struct("=HHHH")
"""lo, hi, flags, ksize: lo | hi << 16 is a leaf's value size, | flags << 32 a branch's child."""
DB = "IHHQQQQQ"
META = struct.Struct("=IIQQ" + DB + DB + "QQ")
"""magic, version, address, mapsize, free DB, main DB, last_pgno, txnid."""
FREE_DBI, MAIN_DBI = 0, 1

_FIX = "restore the shard from a copy or re-pack it; run `shardio verify` to find other damage"


@dataclass(frozen=True)
class LmdbLayout:
    """What the check proved about one LMDB file."""

    page_bytes: int
    last_pgno: int
    txnid: int
    num_entries: int
    depth: int
    num_pages_read: int
    """Branch, leaf and overflow-header pages read by the check."""
    numbered: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 3), np.int64))
    """One row ``(key, offset, size)`` per entry whose key is 8 bytes (a record or block
    number, big-endian), in key order: its value is ``size`` bytes at ``offset``."""
    named: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    """``(offset, size)`` of each value whose key is not 8 bytes long (shard metadata)."""


@dataclass(frozen=True)
class _Db:
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int


@dataclass(frozen=True)
class _Meta:
    page: int
    page_bytes: int
    main: _Db
    free: _Db
    last_pgno: int
    txnid: int


def check_lmdb_file(path: str, *, overflow_headers: bool = False,
                    fd: int | None = None) -> LmdbLayout:
    """Prove that liblmdb reading ``path`` stays inside the file, and find its values.

    Args:
        path: an LMDB file (``subdir=False``) with one unnamed database.
        fd: the file already open (read at its size now; left open): a reader maps the
            very file it checked, even if the path is replaced meanwhile.
        overflow_headers: also read the first page of every overflow run and check
            its header. liblmdb's read path never uses those headers, and on a cold
            file each is a random read (one per big value; docs/decisions.md, "LMDB shards"),
            so readers leave it off: runs are already proved inside the file and
            disjoint from every other page the tree uses.

    Returns:
        The layout the check walked.

    Raises:
        ShardCorruptError: a page, node or meta field is out of bounds or
            inconsistent; the message names the file, the page and the fix.
        TruncatedShardError: the file is shorter than its meta page says.
        UnsupportedVersionError: the file is an LMDB of another data version.
    """
    own = os.open(path, os.O_RDONLY) if fd is None else fd
    try:
        size = os.fstat(own).st_size
        meta = _pick_meta(own, path, size)
        return _TreeCheck(own, path, meta, overflow_headers=overflow_headers).run()
    finally:
        if fd is None:
            os.close(own)


def _corrupt(path: str, where: str, what: str) -> ShardCorruptError:
    return ShardCorruptError(f"{path}: LMDB {where}: {what}; {_FIX}", path=path)


def _read(fd: int, path: str, nbytes: int, offset: int, where: str) -> bytes:
    data = os.pread(fd, nbytes, offset)
    if len(data) != nbytes:
        raise TruncatedShardError(
            f"{path}: LMDB {where} at byte {offset} ends past the end of the file; {_FIX}",
            path=path, offset=offset,
        )
    return data


def _read_meta(fd: int, path: str, page: int, offset: int) -> _Meta:
    """Meta page ``page`` at byte ``offset``, checked as ``mdb_env_read_header`` does."""
    where = f"meta page {page}"
    raw = _read(fd, path, PAGE_HEADER_BYTES + META.size, offset, where)
    pgno, _pad, flags, _lower, _upper = PAGE_HEADER.unpack_from(raw)
    if pgno != page or flags != P_META:
        raise _corrupt(path, where, f"header says page {pgno} with flags {flags:#x}, "
                       f"expected page {page} with flags {P_META:#x} (P_META)")
    fields = META.unpack_from(raw, PAGE_HEADER_BYTES)
    magic, version = fields[0], fields[1]
    if magic != MAGIC:
        raise _corrupt(path, where, f"magic is {magic:#x}, expected {MAGIC:#x}: not an LMDB file")
    if version != DATA_VERSION:
        raise UnsupportedVersionError(
            f"{path}: LMDB {where}: data version {version}, this reader supports "
            f"{DATA_VERSION}; {_FIX}",
            path=path,
        )
    free, main = _Db(*fields[5:12]), _Db(*fields[13:20])
    # The free DB's md_pad holds the page size (mm_psize).
    return _Meta(page, fields[4], main, free, fields[20], fields[21])


def _pick_meta(fd: int, path: str, size: int) -> _Meta:
    """The meta page liblmdb will use (higher txnid, meta 0 on a tie), checked in full."""
    first = _read_meta(fd, path, 0, 0)
    psize = first.page_bytes
    if not MIN_PAGE_BYTES <= psize <= MAX_PAGE_BYTES or psize & (psize - 1):
        raise _corrupt(path, "meta page 0", f"page size {psize} is not a power of two in "
                       f"{MIN_PAGE_BYTES}..{MAX_PAGE_BYTES}")
    second = _read_meta(fd, path, 1, psize)  # liblmdb reads meta 1 at meta 0's page size
    meta = second if second.txnid > first.txnid else first
    where = f"meta page {meta.page} (txnid {meta.txnid})"
    if second.page_bytes != psize:
        raise _corrupt(path, "meta page 1", f"page size {second.page_bytes}, meta page 0 says "
                       f"{psize}")
    if meta.last_pgno < 1 or (meta.last_pgno + 1) * psize > size:
        raise TruncatedShardError(
            f"{path}: shard is {size} bytes but its LMDB {where} says "
            f"{(meta.last_pgno + 1) * psize} (last page {meta.last_pgno}); it is truncated "
            f"or the meta page is damaged; {_FIX}",
            path=path, offset=size,
        )
    for name, db in (("main", meta.main), ("free-page", meta.free)):
        if db.root != NO_PAGE and not 2 <= db.root <= meta.last_pgno:
            raise _corrupt(path, where, f"the {name} database's root is page {db.root}, "
                           f"outside pages 2..{meta.last_pgno}")
    main = meta.main
    if main.flags != 0:
        raise _corrupt(path, where, f"the main database has flags {main.flags:#x}; a shardio "
                       "shard's has none (no duplicates, no named databases)")
    if (main.root == NO_PAGE) != (main.depth == 0) or main.depth > MAX_DEPTH:
        raise _corrupt(path, where, f"the main database's depth {main.depth} does not fit its "
                       f"root page {main.root}")
    return meta


class _TreeCheck:
    """One depth-first, in-key-order walk of the main database's B-tree."""

    def __init__(self, fd: int, path: str, meta: _Meta, *, overflow_headers: bool) -> None:
        self.fd, self.path, self.meta = fd, path, meta
        self.overflow_headers = overflow_headers
        self.psize = meta.page_bytes
        self.seen = bytearray(meta.last_pgno + 1)
        self.seen[0] = self.seen[1] = 1  # the meta pages
        self.counts = {P_BRANCH: 0, P_LEAF: 0, P_OVERFLOW: 0}
        self.entries = 0
        self.reads = 0
        self.last_key: bytes | None = None
        self.numbered: list[int] = []
        """key, offset, size of each value with an 8-byte key, flat."""
        self.named: dict[bytes, tuple[int, int]] = {}

    def run(self) -> LmdbLayout:
        main = self.meta.main
        if main.root != NO_PAGE:
            # (page, depth, lowest key allowed, first key not allowed); children pushed
            # in reverse so that pages come off the stack in key order.
            stack: list[tuple[int, int, bytes | None, bytes | None]] = [(main.root, 1, None, None)]
            while stack:
                pgno, depth, low, high = stack.pop()
                stack.extend(reversed(self._page(pgno, depth, low, high)))
        found = (self.counts[P_BRANCH], self.counts[P_LEAF], self.counts[P_OVERFLOW], self.entries)
        stated = (main.branch_pages, main.leaf_pages, main.overflow_pages, main.entries)
        if found != stated:
            raise _corrupt(self.path, f"meta page {self.meta.page}",
                           "(branch, leaf, overflow pages, entries) of the main database are "
                           f"{stated}, but its tree holds {found}")
        numbered = np.array(self.numbered, np.int64).reshape(-1, 3)
        return LmdbLayout(self.psize, self.meta.last_pgno, self.meta.txnid, main.entries,
                          main.depth, self.reads, numbered, self.named)

    def _claim(self, pgno: int, count: int, where: str) -> None:
        """Mark pages ``pgno..pgno+count-1`` as used; each may be used once."""
        last = self.meta.last_pgno
        if pgno < 2 or pgno + count - 1 > last:
            raise _corrupt(self.path, where, f"pages {pgno}..{pgno + count - 1} lie outside "
                           f"pages 2..{last} of the file")
        if self.seen.find(1, pgno, pgno + count) >= 0:
            raise _corrupt(self.path, where, f"pages {pgno}..{pgno + count - 1} are already "
                           "used elsewhere in the tree (a loop or a shared page)")
        self.seen[pgno:pgno + count] = b"\x01" * count

    def _page(
        self, pgno: int, depth: int, low: bytes | None, high: bytes | None
    ) -> list[tuple[int, int, bytes | None, bytes | None]]:
        """Check one branch or leaf page; returns its children with their key ranges."""
        where = f"page {pgno}"
        self._claim(pgno, 1, where)
        page = _read(self.fd, self.path, self.psize, pgno * self.psize, where)
        self.reads += 1
        header_pgno, _pad, flags, lower, upper = PAGE_HEADER.unpack_from(page)
        expected = P_LEAF if depth == self.meta.main.depth else P_BRANCH
        if header_pgno != pgno or flags != expected:
            raise _corrupt(self.path, where, f"header says page {header_pgno} with flags "
                           f"{flags:#x}, expected page {pgno} with flags {expected:#x} at "
                           f"depth {depth} of {self.meta.main.depth}")
        self.counts[flags] += 1
        num = (lower - PAGE_HEADER_BYTES) >> 1
        if not (PAGE_HEADER_BYTES <= lower <= upper <= self.psize and lower % 2 == 0
                and num >= (2 if flags == P_BRANCH else 1)):
            raise _corrupt(self.path, where, f"free-space bounds {lower}..{upper} do not fit a "
                           f"{self.psize}-byte page with enough nodes")
        ptrs = struct.unpack_from(f"={num}H", page, PAGE_HEADER_BYTES)
        if flags == P_LEAF:
            self._leaf_nodes(page, pgno * self.psize, where, ptrs, upper, low, high)
            return []
        pgnos: list[int] = []
        bounds: list[bytes | None] = [low]  # bounds[i]..bounds[i + 1] is child i's key range
        for i, ptr in enumerate(ptrs):
            lo, hi, nflags, key = self._node(page, where, i, ptr, upper)
            pgnos.append(lo | hi << 16 | nflags << 32)
            if i > 0:  # liblmdb never compares a branch page's first key
                after = bounds[-1]
                if (after is not None and key <= after) or (high is not None and key >= high):
                    raise self._disorder(where, i, key, after, high)
                bounds.append(key)
        bounds.append(high)
        return [(pgno, depth + 1, bounds[i], bounds[i + 1]) for i, pgno in enumerate(pgnos)]

    def _node(
        self, page: bytes, where: str, i: int, ptr: int, upper: int
    ) -> tuple[int, int, int, bytes]:
        """Node ``i`` at byte ``ptr``: ``(lo, hi, flags, key)``, header and key in the page."""
        if ptr < upper or ptr + NODE_HEADER_BYTES > self.psize:
            raise _corrupt(self.path, where, f"node {i} at byte {ptr} lies outside the node "
                           f"area {upper}..{self.psize}")
        lo, hi, nflags, ksize = NODE_HEADER.unpack_from(page, ptr)
        if ptr + NODE_HEADER_BYTES + ksize > self.psize:
            raise _corrupt(self.path, where, f"node {i}'s {ksize}-byte key runs past the end "
                           "of the page")
        return lo, hi, nflags, page[ptr + NODE_HEADER_BYTES:ptr + NODE_HEADER_BYTES + ksize]

    def _leaf_nodes(
        self, page: bytes, at: int, where: str, ptrs: tuple[int, ...], upper: int,
        low: bytes | None, high: bytes | None,
    ) -> None:
        """Keys in order and in range, values inside the page or the file, and where each
        value lies (``at``: the page's place in the file; the hot loop)."""
        psize, node, numbered = self.psize, self._node, self.numbered
        prev = self.last_key
        for i, ptr in enumerate(ptrs):
            lo, hi, nflags, key = node(page, where, i, ptr, upper)
            if prev is not None and key <= prev:  # keys strictly increase from leaf to leaf
                raise self._disorder(where, i, key, prev, None)
            prev = key
            start = ptr + NODE_HEADER_BYTES + len(key)
            size = lo | hi << 16
            offset = at + start
            if nflags or start + size > psize:
                offset = self._value(page, where, i, start, size, nflags)
            if len(key) == 8:
                numbered += (int.from_bytes(key, "big", signed=True), offset, size)
            else:
                self.named[key] = (offset, size)
        first = node(page, where, 0, ptrs[0], upper)[3]
        if low is not None and first < low:
            raise self._disorder(where, 0, first, low, high)
        if high is not None and prev is not None and prev >= high:
            raise self._disorder(where, len(ptrs) - 1, prev, low, high)
        self.last_key = prev
        self.entries += len(ptrs)

    def _disorder(
        self, where: str, i: int, key: bytes, after: bytes | None, before: bytes | None
    ) -> ShardCorruptError:
        """Keys must strictly increase (memcmp order, liblmdb's default) within their range."""
        def show(k: bytes | None) -> str:
            return "-" if k is None else repr(k[:16])

        return _corrupt(self.path, where, f"node {i}'s key {show(key)} is out of order: keys "
                        "must strictly increase within the range its parent branch routes "
                        f"here ({show(after)} .. {show(before)})")

    def _value(self, page: bytes, where: str, i: int, start: int, size: int, flags: int) -> int:
        """Where a leaf node's big value lies in the file, once proved inside an overflow run
        inside the file (an inline value: refused, it runs past its page)."""
        if flags == 0:
            raise _corrupt(self.path, where, f"node {i}'s {size}-byte value runs past the "
                           "end of the page")
        if flags != F_BIGDATA or start + 8 > self.psize:
            raise _corrupt(self.path, where, f"node {i} has flags {flags:#x}; a shardio shard's "
                           f"leaf nodes have 0 or {F_BIGDATA:#x} (a big value)")
        first: int = struct.unpack_from("=Q", page, start)[0]
        count = (PAGE_HEADER_BYTES - 1 + size) // self.psize + 1
        run = f"{where} node {i}: overflow pages {first}..{first + count - 1}"
        self._claim(first, count, run)
        self.counts[P_OVERFLOW] += count
        if not self.overflow_headers:
            return first * self.psize + PAGE_HEADER_BYTES
        raw = _read(self.fd, self.path, OVERFLOW_HEADER.size, first * self.psize, run)
        self.reads += 1
        header_pgno, _pad, oflags, pages = OVERFLOW_HEADER.unpack(raw)
        # Exactly the run the size needs: shardio never rewrites a value in place, the one
        # way liblmdb leaves a longer run behind.
        if header_pgno != first or oflags != P_OVERFLOW or pages != count:
            raise _corrupt(self.path, run, f"the overflow header says page {header_pgno}, flags "
                           f"{oflags:#x}, {pages} pages; expected page {first}, flags "
                           f"{P_OVERFLOW:#x} (P_OVERFLOW), {count} pages for {size} bytes")
        return first * self.psize + PAGE_HEADER_BYTES
