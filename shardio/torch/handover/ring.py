"""Batches from DataLoader workers to the main process through shared memory each worker reuses.

A DataLoader worker hands its batch to the main process by pickling it onto a
queue: a ``RecordBatch`` as one ``bytes`` buffer the main process copies out of
a pipe (about 700 MB/s on a small machine), a tensor as a fresh shared-memory
segment that both processes fault in page by page. On two cores shared by the
main process and two workers, that copy is what made two workers slower than
none. Here each worker owns a *ring* of a few *slots*, one shared-memory segment
each, and writes every batch into a slot that is free (growing a slot, or
adding one, when none fits); what crosses the queue is a small handle: slot,
generation, sequence number and the layout of the batch inside the slot. The
segment itself crosses once, the first time a handle names it.

Lifetimes:

* **Release**: the main process builds the batch's arrays, views and tensors
  over one small owner object per batch; when the last of them is gone, a
  ``weakref.finalize`` on the owner marks the slot free in the slot's header.
  A slot is never written while anything made from its batch is alive, so a
  batch held for as long as the consumer likes stays intact; the worker adds
  slots instead (up to ``max_slots``, then the batch crosses as a copy, the way
  it did before, so a consumer that keeps every batch never stalls a worker).
* **Names**: a segment is a torch shared storage (``file_descriptor`` sharing,
  Linux's default): created with a random name, unlinked at once, and handed to
  the main process as a file descriptor. Nothing is left in ``/dev/shm`` by a
  worker killed at any point, or by a main process killed with it; the memory is
  freed by the kernel when the last process mapping it is gone.

The slot header's two counters are written by one process each (filled by the
worker, released by the main process) and read by the other; a worker reuses a
slot only after reading ``released == filled``, which the main process writes
after its last read. This module is the workers' side; ``shardio.torch.handover.views`` is the
main process's. Imports torch (shared storages); used by ``shardio.torch.loader``
and ``shardio.torch.collate`` only.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import reduction
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import get_worker_info

from shardio.reading.batch import RecordBatch
from shardio.reading.filebytes import FileBytes
from shardio.torch.handover.views import HEADER_BYTES, NO_SLOT, RingBatch, file_bytes

ALIGN = 64
TAIL_BYTES = 64 << 10
"""Room a slot keeps after a collate's own buffer for the batch's small parts (labels)."""
GRANULE = 1 << 20
"""Slot capacities are multiples of this, so a ring holds few distinct sizes."""
DEFAULT_MAX_SLOTS = 8
ENABLED = True
"""False: ``shardio.loader`` hands batches over as before, pickled through the queue (for
``benchmarks/bench_handover.py``, which measures the ring against that)."""
FILES_ENABLED = True
"""False: raw batches of local shards cross through the slots too, copied (for
``benchmarks/bench_handover.py``, which measures the two against each other)."""
SLOTS_BEYOND_PREFETCH = 4
"""Slots a worker may hold beyond its ``prefetch_factor`` batches queued: the batch being
built, the one the consumer uses, one a ``DevicePrefetcher`` took ahead, one to spare."""

UInt8Array = npt.NDArray[np.uint8]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class _Slot:
    """One shared segment of a worker's ring."""

    storage: torch.Tensor
    generation: int
    sent: bool = False
    data: UInt8Array = field(init=False)
    state: npt.NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        whole = self.storage.numpy()
        self.data = whole[HEADER_BYTES:]
        self.state = whole[:16].view(np.int64)
        self._counters = self.state.data  # Python ints: no numpy scalar per look

    @property
    def free(self) -> bool:
        """Whether the main process released the last batch written here."""
        counters = self._counters
        return bool(counters[0] == counters[1])

    @property
    def address(self) -> int:
        return int(self.data.ctypes.data)


class WorkerRing:
    """A worker's slots, and the batch being built in one of them."""

    def __init__(
        self, token: str, max_slots: int = DEFAULT_MAX_SLOTS, roots: tuple[str, ...] = ()
    ) -> None:
        self.token = token
        self.max_slots = max_slots
        self.files = _MappedFiles(roots) if roots else None
        """Where record batches may cross as places in their shard files (see ``_MappedFiles``)."""
        self.pid = os.getpid()
        self.slots: list[_Slot] = []
        self._seq = 0
        self._generation = 0
        self._lease: int | None = None
        self._used = 0

    def buffer(self, nbytes: int) -> UInt8Array | None:
        """Memory for the batch being built (a collate's output buffer), or None.

        Reserves a free slot with ``nbytes`` and some room after them; ``publish``
        then finds the batch's tensors already in place. None when the batch
        already has a buffer or every slot is held.
        """
        if self._lease is not None:
            return None
        index = self._acquire(_aligned(nbytes) + TAIL_BYTES)
        if index is None:
            return None
        self._lease, self._used = index, _aligned(nbytes)
        return self.slots[index].data[:nbytes]

    def abandon(self) -> None:
        """Forget the batch being built (its collate failed); the slot stays free."""
        self._lease, self._used = None, 0

    def _acquire(self, nbytes: int) -> int | None:
        """A free slot of at least ``nbytes``: one that fits, a free one grown, or a new one."""
        first_free = None
        for i, slot in enumerate(self.slots):
            if i != self._lease and slot.free:
                if slot.data.size >= nbytes:
                    return i
                if first_free is None:
                    first_free = i
        capacity = -(-(nbytes + nbytes // 4) // GRANULE) * GRANULE
        if first_free is not None:
            self.slots[first_free] = self._new_slot(capacity)
            return first_free
        if len(self.slots) < self.max_slots:
            self.slots.append(self._new_slot(capacity))
            return len(self.slots) - 1
        return None

    def _new_slot(self, capacity: int) -> _Slot:
        self._generation += 1
        storage = torch.zeros(HEADER_BYTES + capacity, dtype=torch.uint8)
        storage.share_memory_()  # type: ignore[no-untyped-call]
        return _Slot(storage, self._generation)

    def publish(self, obj: Any) -> Any:
        """``obj`` as a handle to its copy in a slot, or ``obj`` itself where none is free.

        Tensors (CPU) and ``RecordBatch`` objects anywhere in nested tuples,
        lists and dicts go to the slot; tensors the collate already wrote into
        this batch's ``buffer`` are not copied. Everything else crosses as it is.
        """
        lease = self._lease
        packer = _Packer(self.slots[lease] if lease is not None else None, self._used,
                         self.files)
        skeleton = packer.describe(obj)
        if lease is None and not packer.copies:  # nothing for a slot (places in files): no slot
            return RingBatch(self.token, self.pid, NO_SLOT, 0, 0, None, skeleton)
        index = lease
        if index is None or packer.end > self.slots[index].data.size:
            index = self._acquire(packer.end)  # another slot: the lease's data moves there
        self._lease = None
        if index is None:
            return _detached(obj, packer)
        slot = self.slots[index]
        if lease is not None and index != lease:  # outgrew its buffer's slot: move what is there
            slot.data[: self._used] = self.slots[lease].data[: self._used]
        packer.write(slot.data)
        self._seq += 1
        slot.state[0] = self._seq
        storage = None if slot.sent else slot.storage
        slot.sent = True
        return RingBatch(self.token, self.pid, index, slot.generation, self._seq, storage, skeleton)


class _Packer:
    """Lays out an object's tensors and record batches in a slot, then writes them."""

    def __init__(self, lease: _Slot | None, used: int, files: _MappedFiles | None = None) -> None:
        self.lease = lease
        self.end = used
        self.files = files
        self.copies: list[tuple[int, torch.Tensor | RecordBatch, list[Any]]] = []

    def _place(self, nbytes: int, source: torch.Tensor | RecordBatch, entry: list[Any]) -> None:
        entry.insert(1, self.end)
        self.copies.append((self.end, source, entry))
        self.end = _aligned(self.end + nbytes)

    def in_lease(self, tensor: torch.Tensor) -> int | None:
        """Byte offset of ``tensor`` in the leased slot, or None if it lies elsewhere."""
        if self.lease is None or tensor.numel() == 0:
            return None
        start = self.lease.address
        lo = tensor.data_ptr()
        span = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
        hi = lo + (span + 1) * tensor.element_size()
        return lo - start if start <= lo and hi <= start + self.lease.data.size else None

    def describe(self, obj: Any) -> Any:
        """The skeleton of ``obj``: containers kept, tensors and record batches as places."""
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
            at = self.in_lease(obj)
            if at is not None:
                return ["t", at, obj.dtype, tuple(obj.shape), obj.stride()]
            dense = obj.contiguous()
            entry = ["t", obj.dtype, tuple(obj.shape), dense.stride()]
            self._place(dense.numel() * dense.element_size(), dense, entry)
            return entry
        if type(obj) is RecordBatch:
            placed = self.files.describe(obj) if self.files is not None else None
            if placed is not None:
                return placed
            entry = ["r", None]
            self._place(obj.shared_nbytes(), obj, entry)
            return entry
        if type(obj) in (tuple, list):
            return ["u" if type(obj) is tuple else "l", [self.describe(v) for v in obj]]
        if type(obj) is dict:
            return ["d", [(k, self.describe(v)) for k, v in obj.items()]]
        return ["v", obj]

    def write(self, data: UInt8Array) -> None:
        """Copy what is not in place yet; a record batch's entry gets its layout."""
        for at, source, entry in self.copies:
            if isinstance(source, RecordBatch):
                entry[2] = source.write_shared(data, at)[0]
            else:
                raw = source.reshape(-1).view(torch.uint8).numpy()
                data[at : at + raw.size] = raw


class _MappedFiles:
    """A worker's record batches as places in the shard files they were read from.

    A raw batch's samples are views of the worker's maps of its shards (``zero_copy``):
    instead of copying them into a slot (8.5 us of an 80 KB image's 35 in the worker,
    on the two cores the main process shares), the batch crosses as the file, offset
    and length of each sample, and the main process views its own map of the same
    file (``shardio.torch.handover.views``): no copy on either side. Only files under ``roots``
    (the dataset's local folder: never a remote reader's cache, whose files are
    evicted) and only batches whose every piece is such a view; anything else goes
    through the slot. The main process checks that it maps the file the worker read
    (device and inode, from ``/proc/self/maps``).

    The main process does not open a file by path to map it: the first batch naming a
    file also carries a descriptor of it, duplicated from this worker's (``_handles``).
    On a network filesystem each open is a round trip to its metadata server, the cost
    packing into shards exists to avoid; a worker already paid it for its shards.
    """

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = tuple(r.rstrip(os.sep) + os.sep for r in roots)
        self._known: dict[int, tuple[weakref.ref[mmap.mmap], int, FileId | None]] = {}
        self._sent: set[FileId] = set()
        """Files whose descriptor a batch carried (or could not: none held here)."""

    def locate(self, owner: mmap.mmap) -> tuple[int, FileId | None]:
        """Where ``owner`` is mapped, and its file (None: not one of ``roots``)."""
        known = self._known.get(id(owner))
        if known is not None and known[0]() is owner:
            return known[1], known[2]
        base = _address(memoryview(owner)[:1])
        found = _file_at(base, self.roots)
        self._known = {k: v for k, v in self._known.items() if v[0]() is not None}
        self._known[id(owner)] = (weakref.ref(owner), base, found)
        return base, found

    def describe(self, batch: RecordBatch) -> list[Any] | None:
        """``batch`` as its files and the place of each piece in them, or None.

        One int64 table carries each piece's ``(file, offset, length)`` (file -1: a
        field the sample lacks), the indices, the offsets and int columns; the keys
        cross as one ``str`` and their ends: a few objects to pickle per batch
        instead of a few per sample (``shmview.file_batch`` reads them back).
        """
        pieces = batch._pieces  # the views of the blocks read, until the batch is joined
        if not pieces:
            return None
        places = self._filed(batch) if batch.places is not None else self._asked(pieces)
        if places is None:
            return None
        files, where, starts, sizes = places
        n = len(batch.indices)
        ints = [name for name, col in batch.values.items() if isinstance(col, np.ndarray)]
        keys = batch.keys
        key_ends = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, keys), np.int64, n), out=key_ends[1:])
        table = np.concatenate([
            np.asarray(where, np.int64), np.asarray(starts, np.int64),
            np.asarray(sizes, np.int64),
            batch.indices.astype(np.int64, copy=False), *batch.offsets.values(),
            *(np.asarray(batch.values[name], np.int64) for name in ints), key_ends,
        ])
        others = {name: col for name, col in batch.values.items() if name not in ints}
        return ["f", tuple(files), self._handles(files), n, len(pieces), table,
                list(batch.offsets), ints, others, list(batch.values), batch.missing,
                "".join(keys)]

    def _handles(self, files: dict[FileId, int]) -> tuple[Any, ...] | None:
        """For each of ``files`` new to this worker's batches, its descriptor to send.

        A ``multiprocessing.reduction.DupFd`` (per file, else None; None for the whole
        batch when every file was sent before): unpickled in the main process, it
        brings a duplicate of the descriptor over a Unix socket (SCM_RIGHTS).

        Each file's descriptor is sent once, and nothing waits for it to arrive: a
        batch carrying one may never be unpickled (the DataLoader drops what is queued
        when it shuts its workers down), and the main process then opens by path a file
        it has neither mapped nor received, as it did before descriptors were sent
        (``shmview._mapped_file``). Re-sending until the main process acknowledged one
        would need a channel back to the worker for a case that costs one open. The
        duplicate of a descriptor never fetched stays in this worker until it exits:
        at most one per file.
        """
        new = [f for f in files if f not in self._sent]
        if not new:
            return None
        self._sent.update(new)
        held = _held_handles(new)
        return tuple(held.get(f) for f in files)

    def _filed(self, batch: RecordBatch) -> _Places | None:
        """Each piece's file, start and length, from where the reader filed them."""
        assert batch.places is not None
        maps, starts = batch.places
        numbers: dict[int, int] = {}  # id(map) -> its file's number
        files: dict[FileId, int] = {}
        for owner in {id(m): m for m in maps if m is not None}.values():
            if type(owner) is not mmap.mmap:
                return None
            _base, found = self.locate(owner)
            if found is None:
                return None
            numbers[id(owner)] = files.setdefault(found, len(files))
        where = np.array([-1 if m is None else numbers[id(m)] for m in maps], np.int64)
        sizes = np.concatenate([np.diff(offs) for offs in batch.offsets.values()])
        return files, where, np.where(where < 0, 0, starts), sizes

    def _asked(self, pieces: list[bytes | memoryview]) -> _Places | None:
        """Each piece's file, start and length, asked of each view (about 1 us a view)."""
        files: dict[FileId, int] = {}
        numbers: dict[int, tuple[int, int]] = {}  # id(map) -> (its base, its file's number)
        where: list[int] = []
        starts: list[int] = []
        sizes: list[int] = []
        frombuffer, uint8 = np.frombuffer, np.uint8
        for piece in pieces:
            if type(piece) is not memoryview or not piece.nbytes:
                if len(piece):
                    return None
                where.append(-1)  # a field this sample lacks, or an empty value
                starts.append(0)
                sizes.append(0)
                continue
            owner = piece.obj
            known = numbers.get(id(owner))
            if known is None:
                if type(owner) is not mmap.mmap:
                    return None
                base, found = self.locate(owner)
                if found is None:
                    return None
                known = numbers[id(owner)] = (base, files.setdefault(found, len(files)))
            where.append(known[1])
            starts.append(frombuffer(piece, uint8).ctypes.data - known[0])
            sizes.append(piece.nbytes)
        return files, where, starts, sizes


_PLACED: list[_MappedFiles] = []
"""This worker's files that ``FileBytes`` values may cross as places in (``place_file_bytes``)."""


def place_file_bytes(roots: tuple[str, ...]) -> None:
    """Let this process's ``FileBytes`` of shard files under ``roots`` cross to another
    process as places (a DataLoader worker of a local dataset, through a plain DataLoader).

    Kept while the roots stay the same, so a persistent worker sends each file's
    descriptor once over all its epochs.
    """
    if not FILES_ENABLED or not roots:
        _PLACED.clear()
        return
    wanted = tuple(r.rstrip(os.sep) + os.sep for r in roots)
    if not _PLACED or _PLACED[0].roots != wanted:
        _PLACED[:] = [_MappedFiles(roots)]


def _reduce_file_bytes(value: FileBytes) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A ``FileBytes`` pickled by ``multiprocessing`` (a DataLoader's queue): its file,
    offset and length where its map is a shard file under the registered roots (the
    first value naming a file brings the file's descriptor), else its bytes."""
    source = getattr(value, "source", None)
    if _PLACED and type(source) is mmap.mmap:
        files = _PLACED[0]
        try:
            _base, found = files.locate(source)
        except ValueError:  # the map was closed meanwhile (its reader's iteration ended)
            found = None
        if found is not None:
            handles = files._handles({found: 0})
            return file_bytes, (found, value.offset, len(value),
                                None if handles is None else handles[0])
    return bytes, (bytes(value),)


reduction.ForkingPickler.register(FileBytes, _reduce_file_bytes)


FileId = tuple[str, int, int]
"""A shard file as ``(path, st_dev, st_ino)``."""
_Places = tuple[dict[FileId, int], Any, Any, Any]
"""A batch's files, and each piece's file number (-1: none), start and length."""


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8, count=1).ctypes.data)


def _file_at(base: int, roots: tuple[str, ...]) -> FileId | None:
    """The file mapped from its start at address ``base`` in this process, if under ``roots``."""
    start = f"{base:x}-"
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                if line.startswith(start):
                    fields = line.split(maxsplit=5)
                    if len(fields) < 6 or int(fields[2], 16) != 0:
                        return None
                    path = fields[5].rstrip("\n")
                    if path.endswith(" (deleted)") or not path.startswith(roots):
                        return None
                    major, minor = (int(x, 16) for x in fields[3].split(":"))
                    return path, os.makedev(major, minor), int(fields[4])
    except OSError:  # no /proc (not Linux): batches cross through the slots
        return None
    return None


def _held_handles(files: list[FileId]) -> dict[FileId, Any]:
    """A ``DupFd`` of a descriptor this process holds on each of ``files`` it finds one of.

    The shard reader keeps its descriptor open, and a ``mmap.mmap`` keeps its own
    duplicate while it is open (a batch's views keep it open); neither is reachable
    from the map, so they are found by name in ``/proc/self/fd`` (a readlink each, no
    open of the file). Each is duplicated before it is checked, so a descriptor closed
    and reused meanwhile by another thread is never sent for the wrong file.
    """
    wanted = {path: (path, dev, inode) for path, dev, inode in files}
    found: dict[FileId, Any] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: the main process opens the files by path
        return found
    for name in names:
        try:
            file = wanted.get(os.readlink(f"/proc/self/fd/{name}"))
            if file is None or file in found:
                continue
            fd = os.dup(int(name))
        except (OSError, ValueError):  # closed meanwhile (or the listing's own descriptor)
            continue
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == file[1:]:
                found[file] = reduction.DupFd(fd)  # its own duplicate, until fetched
        except OSError:
            pass
        finally:
            os.close(fd)
    return found


def _detached(obj: Any, packer: _Packer) -> Any:
    """``obj`` with tensors in the abandoned lease copied out (it crosses as before)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone() if packer.in_lease(obj) is not None else obj
    if type(obj) in (tuple, list):
        return type(obj)(_detached(v, packer) for v in obj)
    if type(obj) is dict:
        return {k: _detached(v, packer) for k, v in obj.items()}
    return obj


_RINGS: dict[str, WorkerRing] = {}
"""Worker process: its ring per loader token."""
_ACTIVE: WorkerRing | None = None


def active_ring() -> WorkerRing | None:
    """The ring of the batch a ``RingCollate`` is building in this worker, else None."""
    return _ACTIVE


@contextmanager
def _building(ring: WorkerRing) -> Iterator[WorkerRing]:
    global _ACTIVE
    _ACTIVE = ring
    try:
        yield ring
    except BaseException:
        ring.abandon()
        raise
    finally:
        _ACTIVE = None


class RingCollate:
    """A collate that, in a DataLoader worker, hands its batches over through the worker's ring.

    In the main process (``num_workers=0``) it is the collate itself. Picklable
    (for ``spawn`` workers): the ring is made in the worker on first use.
    """

    def __init__(
        self, collate: Callable[[list[Any]], Any], token: str, *,
        max_slots: int = DEFAULT_MAX_SLOTS, roots: tuple[str, ...] = (),
    ) -> None:
        """Args:
        collate: the collate to wrap.
        token: names the loader's rings.
        max_slots: slots a worker's ring may hold.
        roots: local folders whose shard files record batches may cross as places
            in (``_MappedFiles``); empty: every batch through the slots.
        """
        self.collate = collate
        self.token = token
        self.max_slots = max_slots
        self.roots = roots

    def __call__(self, samples: list[Any]) -> Any:
        if get_worker_info() is None:
            return self.collate(samples)
        ring = _RINGS.get(self.token)
        if ring is None or ring.pid != os.getpid():
            ring = _RINGS[self.token] = WorkerRing(self.token, self.max_slots, self.roots)
        with _building(ring):
            out = self.collate(samples)
        return ring.publish(out)
