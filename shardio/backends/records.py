"""The ``records`` backend: one flat ``.rec`` file per shard.

Layout (docs/format.md): a header (16 bytes in v1, 32 in v2, naming the
records' checksum), the framed records back to back, an index of
``num_records + 1`` little-endian u64 offsets (record ``i`` spans
``offsets[i]:offsets[i+1]``) followed in v2 by as many u32 *chain* values (the
checksum of the file up to each record), the keys as one msgpack array of str,
and a fixed footer that says where the index and keys start. A reader maps the
file once and hands out views of the map: no copy and no syscall per record or
per run; a run's pages are dropped from this process once its window is done
(``drop_pages``), so resident memory stays about one shuffle window.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import numpy as np

from shardio.backends import ShardFileEncoder, keys_crc32, open_shard_file, pack_keys
from shardio.errors import ShardCorruptError
from shardio.format.blockfile import HEADER as HEADER3
from shardio.format.blockfile import VERSION as VERSION3
from shardio.format.blockfile import BlockIndex, RecFileWriter3, parse_rec
from shardio.format.checksum import CRC32C, IDS, checksum_function, digest
from shardio.format.frames import (
    CHECKSUM_OF_VERSION,
    FOOTER_SIZE,
    FORMAT_VERSION,
    HEADER_SIZES,
    RunBytes,
    check_header,
    pack_footer,
    pack_header,
    parse_index,
    tail_bytes,
    unpack_footer,
)
from shardio.format.record import KEY_FIELD

WRITE_BUFFER_BYTES = 1 << 20
"""Large enough that writes are few; small enough that glibc does not map (and the kernel
zero) a fresh buffer for every shard, which cost pack about 3 ms of CPU per shard at 8 MB."""
PAGE = mmap.PAGESIZE
FAULT_AROUND = 2 << 20
"""How far around the records a process read the kernel may have mapped a shard's pages
into it: a read fault maps the neighbouring pages already cached (``fault_around_bytes``,
64 KiB by default) and, on recent kernels, a large page-cache folio whole (up to 2 MiB,
the PMD size). Records a process never reads, next to those it does, end up in its
resident set that way: a DataLoader worker taking every other batch reads a scattered
half of each block and held its neighbours' records, never dropped, to the end of the
epoch (peak RSS of 2 workers on the 8,000-image tree: 1,310 -> 1,143 MB with drops
widened to this; tests/backends/test_memory_pages.py)."""

PROBED_BYTES = 1 << 20
"""Runs at least this long are hinted (``will_need``) only where they are not cached."""


def advise_open(path: str | Path, size: int, num_records: int) -> int | None:
    """Open a ``.rec`` shard's file and ask the kernel to start reading what opening the
    shard reads: its header page and its tail (footer, index and keys; ``size`` and
    ``num_records`` from the manifest). Returns the descriptor, for ``RecordsShardReader``
    to take (one open per shard, as before), or None where the file cannot be opened
    (the reader's own open then names what is wrong).

    Opening reads both through the map, and a fault on a page not cached reads the
    device's whole read-ahead window around it (often 8 MiB) before it returns, holding
    the GIL: a window's first use of 40 cold shards of 16 MB took 0.4-0.5 s that way, one
    shard after another, most of a cold epoch. Asked for a whole window's shards at
    once, the reads run together and each open finds its pages cached.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, PAGE, os.POSIX_FADV_WILLNEED)
        tail = tail_bytes(size, num_records, PAGE)
        os.posix_fadvise(fd, size - tail, tail, os.POSIX_FADV_WILLNEED)
    return fd


class RecordsShardWriter:
    """Writes one ``.rec`` shard, computing its file checksum (the v2 chain) as it goes."""

    def __init__(self, path: Path, *, version: int = FORMAT_VERSION, codec: str = "zstd",
                 level: int = 3, block_records: int | None = None) -> None:
        """Start ``path`` in format ``version`` (1 and 2 exist to write the datasets older
        readers made); ``codec`` and ``level``: how ``add`` compresses; ``block_records``:
        v3 records a block."""
        self.path = Path(path)
        self.version = version
        self.checksum = CHECKSUM_OF_VERSION[version]
        self._compute = checksum_function(self.checksum)
        self._ident = IDS.get(self.checksum, 0)
        self._fh: BinaryIO | None = open(self.path, "wb", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115 - closed in finish/abort
        self._crc = 0
        self._size = 0
        self._offsets: list[int] = []
        self._chain: list[int] = []
        self._keys: list[str] = []
        self._encode = ShardFileEncoder(version, codec, level)
        self._v3 = RecFileWriter3(self._fh, level=self._encode.level,
                                  block_records=block_records) if version == 3 else None
        if self._v3 is None:
            self._write(pack_header(version, self.checksum))

    def add(self, sample: Mapping[str, Any]) -> None:
        """Add the next sample (with its ``__key__``), encoded as this shard's version does."""
        if self._v3 is not None:
            self._v3.append(sample)
        else:
            self.append(sample[KEY_FIELD], self._encode.frame(sample))

    @property
    def keys_crc32(self) -> int:
        """The manifest's ``keys_crc32`` of the shard as written so far (after ``finish``)."""
        return self._keys_crc32 if self._v3 is not None else keys_crc32(self._keys)

    def _write(self, data: bytes) -> None:
        assert self._fh is not None, "shard already finished"
        self._fh.write(data)
        self._crc = self._compute(data, self._crc)
        self._size += len(data)

    def append(self, key: str, framed: bytes) -> None:
        """Add the next record (framed with this shard's checksum)."""
        if self.version >= 3:
            raise TypeError(f"{self.path}: a format v3 shard takes samples (add), not frames")
        if len(framed) < 12 or framed[9] != self._ident:
            raise ValueError(f"{self.path}: a frame for a {self.checksum} shard must name "
                             f"checksum id {self._ident}")
        self._offsets.append(self._size)
        self._chain.append(self._crc)
        self._keys.append(key)
        self._write(framed)

    def finish(self) -> tuple[int, str]:
        """Write index, keys and footer; fsync; return ``(bytes, checksum)``."""
        if self._v3 is not None:
            size, checksum, self._keys_crc32 = self._v3.finish()
            self._close_synced()
            return size, checksum
        index_offset = self._size
        index = np.asarray([*self._offsets, index_offset], dtype="<u8").tobytes()
        if self.version > 1:
            index += np.asarray([*self._chain, self._crc], dtype="<u4").tobytes()
        tail = index + pack_keys(self._keys)
        self._write(tail)
        self._write(pack_footer(index_offset, index_offset + len(index), len(self._keys),
                                self._compute(tail, 0), self.version, self.checksum))
        self._close_synced()
        return self._size, digest(self.checksum, self._crc)

    def _close_synced(self) -> None:
        assert self._fh is not None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None

    def abort(self) -> None:
        """Close and delete the partial file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self.path.unlink(missing_ok=True)


class RecordsShardReader:
    """Maps one ``.rec`` shard and serves its records as views of the map."""

    def __init__(self, path: str | Path, fd: int | None = None) -> None:
        """Map shard ``path`` and check its header, footer and index; ``fd``: the file,
        already open (``advise_open``), which the reader then owns."""
        self.path = str(path)
        if fd is None:
            fd = open_shard_file(self.path)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZES[1] + FOOTER_SIZE:
                unpack_footer(b"\0" * size, path=self.path)
            self._mmap = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.size = size
        self._address: int | None = _map_address(self._mmap) if size else None
        """Where the map starts in this process, for ``mincore`` (None: not asked)."""
        view = memoryview(self._mmap)
        self._view = view
        try:
            self._check_layout(view, size)
        except BaseException:  # a damaged shard: its descriptor must not outlive the error
            self._fd = -1
            os.close(fd)
            raise

    def _check_layout(self, view: memoryview, size: int) -> None:
        """Check header, footer and index, and keep what reading records needs of them."""
        self.block_index: BlockIndex | None = None
        self._offsets_list: list[int] = []
        self._keys: Sequence[str] | None = None
        if size >= 12 and int.from_bytes(view[8:12], "little") == VERSION3:
            index3 = parse_rec(view[: HEADER3.size], view, size, path=self.path)
            self.block_index = BlockIndex(index3)
            self.version, self.checksum = VERSION3, CRC32C
            self.num_records = index3.num_records
            self.offsets = np.asarray(index3.block_offsets, "<u8")
            self._chain = None
            self._keys = index3.keys
            return
        header = check_header(view[: HEADER_SIZES[2]], path=self.path)
        footer = unpack_footer(view, path=self.path)
        if (footer.version, footer.checksum) != (header.version, header.checksum):
            raise ShardCorruptError(
                f"{self.path}: the header says format v{header.version} with {header.checksum} "
                f"but the footer v{footer.version} with {footer.checksum}; the shard is "
                "damaged: restore it from a copy or re-pack",
                path=self.path, offset=0,
            )
        self.version = footer.version
        self.checksum = footer.checksum
        # One checksum over the index and key block on open (a few bytes per record, next to
        # the footer): a damaged offset could otherwise frame another intact record.
        index = parse_index(view[footer.index_offset : size - footer.size], footer, path=self.path)
        self.num_records = footer.num_records
        self.offsets = index.offsets
        self._offsets_list = index.offsets.tolist()
        self._chain = index.chain
        self._key_block = index.key_block
        self._keys_offset = footer.keys_offset

    def frame(self, index: int) -> memoryview:
        """Framed bytes of record ``index``."""
        self._check_framed()
        if not 0 <= index < self.num_records:
            raise IndexError(f"{self.path}: record {index} out of range 0..{self.num_records - 1}")
        offs = self._offsets_list
        return self._view[offs[index] : offs[index + 1]]

    def _check_framed(self) -> None:
        if self.block_index is not None:
            raise TypeError(f"{self.path}: a format v3 shard holds blocks, not one frame a "
                            "record: read records with read_run and shardio.format.runs")

    def offset(self, index: int) -> int:
        """Byte offset of record ``index`` (v3: of its block)."""
        if self.block_index is not None:
            return self.block_index.byte_span(index, index + 1)[0]
        return self._offsets_list[index]

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        """The bytes holding records ``start..stop`` (v3: their whole blocks)."""
        if self.block_index is None:
            return self._offsets_list[start], self._offsets_list[stop]
        return self.block_index.byte_span(start, stop)

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(index, framed bytes)`` front to back."""
        self._check_framed()
        stop = self.num_records if stop is None else stop
        offs = self._offsets_list
        view = self._view
        for i in range(start, stop):
            yield i, view[offs[i] : offs[i + 1]]

    def will_need(self, start: int, stop: int) -> None:
        """Ask the kernel to start reading records ``start..stop`` now (asynchronous readahead),
        unless their first, middle and last pages are in the page cache already.

        On cached pages the hint reads nothing but still looks up every page: 25 us for a
        2 MB block, a tenth of a warm image epoch on the reading thread. Asking where
        three of its pages are costs a fifth of that (more than the hint itself on blocks
        under ``PROBED_BYTES``, which are hinted without asking); a block whose ends are
        cached is nearly always cached whole (it was read, and is evicted, as one), and a
        page missed that way is read when first touched, as without hints.
        """
        if not hasattr(os, "posix_fadvise"):
            return
        lo, hi = self._span(start, stop)
        if hi <= lo or (hi - lo >= PROBED_BYTES and all(
                self._cached(at) for at in (lo, (lo + hi) // 2, hi - 1))):
            return
        os.posix_fadvise(self._fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)

    def _cached(self, offset: int) -> bool:
        """Whether the page holding byte ``offset`` is in the page cache (False: unknown)."""
        mincore = _libc_mincore()
        if mincore is None or self._address is None:
            return False
        import ctypes

        resident = ctypes.c_ubyte(0)
        if mincore(self._address + offset // PAGE * PAGE, PAGE, ctypes.byref(resident)) != 0:
            return False
        return bool(resident.value & 1)

    def read_run(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` as one view of the map, with their bounds and chain values."""
        if not 0 <= start <= stop <= self.num_records:
            raise IndexError(f"{self.path}: records {start}..{stop} out of range "
                             f"0..{self.num_records}")
        if self.block_index is not None:
            return self.block_index.run(self._view, start, stop)
        base = self._offsets_list[start]
        bounds = self.offsets[start : stop + 1].astype(np.int64)
        bounds -= base
        chain = None if self._chain is None else self._chain[start : stop + 1]
        return RunBytes(self._view[base : self._offsets_list[stop]], bounds, self.checksum,
                        chain, base)

    def read_frames(self, start: int, stop: int) -> list[memoryview]:
        """Records ``start..stop``: views of the map, one per record."""
        self._check_framed()
        offs = self._offsets_list
        view = self._view
        return [view[offs[i] : offs[i + 1]] for i in range(start, stop)]

    def drop_pages(self, start: int, stop: int, keep: Sequence[tuple[int, int]] = (),
                   *, later: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Drop the pages of records ``start..stop`` from this process (not from the page cache).

        The map is shared and read-only, so a view still held re-reads its bytes from
        the file; what goes is this process's resident share, which would otherwise
        grow to every shard read. The span is widened to whole ``FAULT_AROUND``
        blocks: the kernel mapped the records next to those read too. Called when a
        window closes, so what goes beyond the span is either never read by this
        process or mapped again on its next touch. ``keep``: record spans
        ``(start, stop)`` whose pages stay (the next window's runs, already mapped by
        the checker thread: dropped, the reader would fault them in again). ``later``:
        run the drop through it (``Checker.later``) instead of here. Unmapping a
        window's pages costs the kernel about a fifth of a warm image epoch, and
        ``mmap.madvise`` holds the GIL meanwhile; a later drop calls ``madvise``
        through ctypes, which lets the GIL go, and holds a view of the map until it
        is done, so the mapping cannot go (or its addresses be reused) before.
        """
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        first, last = self._span(start, stop)
        lo = first // FAULT_AROUND * FAULT_AROUND
        hi = min(self.size, -(-last // FAULT_AROUND) * FAULT_AROUND)
        spans: list[tuple[int, int]] = []
        for a, b in sorted((x // PAGE * PAGE, -(-y // PAGE) * PAGE)
                           for x, y in (self._span(a, b) for a, b in keep if b > a)):
            if b <= lo or a >= hi:
                continue
            if a > lo:
                spans.append((lo, a - lo))
            lo = max(lo, b)
        if hi > lo:
            spans.append((lo, hi - lo))
        if later is not None and spans and _libc_madvise() is not None:
            later(partial(_drop_spans, memoryview(self._mmap), spans))
            return
        for at, length in spans:
            self._mmap.madvise(mmap.MADV_DONTNEED, at, length)

    def keys(self) -> Sequence[str]:
        """Every record's ``__key__``, read from the key block on first use."""
        if self._keys is None:
            try:
                keys = msgpack.unpackb(self._key_block, raw=False)
            except Exception:  # msgpack raises several unrelated types on bad input
                keys = None
            # the block passed its checksum on open, so only a broken writer gets here
            if not isinstance(keys, list) or len(keys) != self.num_records or not (
                set(map(type, keys)) <= {str}  # a third of the time of an isinstance loop
            ):
                raise ShardCorruptError(
                    f"{self.path}: the key block at byte {self._keys_offset} is not a list of "
                    f"{self.num_records} str keys; the shard was written by a broken writer: "
                    "re-pack it",
                    path=self.path, offset=self._keys_offset,
                )
            self._keys = keys
        return self._keys

    def close(self) -> None:
        """Unmap the file (later, when the last record view a caller holds is dropped)."""
        self.offsets = np.empty(0, dtype="<u8")
        self._chain = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            if self.block_index is None:
                self._key_block.release()
            self._view.release()
            self._mmap.close()
        except BufferError:
            pass


_LIBC: dict[str, Callable[..., int] | None] = {}


def _libc(name: str, *argtypes: object) -> Callable[..., int] | None:
    """libc's function ``name`` through ctypes, taking ``argtypes`` and returning an int
    (None where there is none). A ctypes call lets the GIL go while it runs."""
    if name not in _LIBC:
        found = None
        try:
            import ctypes

            function = getattr(ctypes.CDLL(None, use_errno=True), name)
            function.argtypes = list(argtypes)
            function.restype = ctypes.c_int
            found = function
        except (OSError, AttributeError):  # no C library to load, or no such function in it
            pass
        _LIBC[name] = found
    return _LIBC[name]


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """``madvise(addr, length, advice)``."""
    import ctypes

    return _libc("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _libc_mincore() -> Callable[[int, int, object], int] | None:
    """``mincore(addr, length, vec)``."""
    import ctypes

    return _libc("mincore", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def _map_address(mapped: mmap.mmap) -> int:
    whole = np.frombuffer(mapped, np.uint8)
    address = int(whole.ctypes.data)
    del whole  # its hold on the map, which close() must be able to unmap
    return address


def _drop_spans(view: memoryview, spans: list[tuple[int, int]]) -> None:
    """``MADV_DONTNEED`` the ``(offset, length)`` spans of the map ``view`` is of, without the
    GIL; then let the view (and with it the mapping) go."""
    try:
        madvise = _libc_madvise()
        assert madvise is not None  # drop_pages queues this only where there is one
        whole = np.frombuffer(view, np.uint8)
        base = int(whole.ctypes.data)
        del whole  # its hold on the view, which is released below
        for at, length in spans:
            madvise(base + at, length, mmap.MADV_DONTNEED)  # a failure leaves pages mapped
    finally:
        view.release()
