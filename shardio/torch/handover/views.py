"""The main process's side of ``shardio.torch.handover.ring``: batches as views of a worker's slots.

A worker's handle (``RingBatch``) unpickles here into the batch itself: its
arrays, memoryviews and tensors are views of the slot's memory, made over one
small *owner* object per batch that every one of them keeps alive. When the last
is gone, a ``weakref.finalize`` on the owner writes the batch's sequence number
into the slot's header, which gives the slot back to the worker. Each segment is
mapped here once, when the first handle naming it arrives (it brings the segment
as a file descriptor), and kept per ``(loader token, worker pid, slot)`` until
the loader forgets its workers. A raw batch whose samples are views of the
worker's maps of local shard files crosses as places in those files instead
(``shmring._MappedFiles``): here its samples are views of this process's own map of
each file, mapped once from the descriptor the worker sends with the first batch
naming it (opened by path only where that batch never arrived), checked to be the
file the worker read. Imports torch.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from operator import itemgetter
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch

from shardio.reading.batch import RecordBatch
from shardio.torch.handover import pinned

HEADER_BYTES = 64
"""A slot's header: ``[filled, released]`` sequence numbers (int64), padded to a cache line."""
NO_SLOT = -1
"""A handle's slot when nothing of its batch is in a slot (places in shard files only)."""

UInt8Array = npt.NDArray[np.uint8]


class RingBatch:
    """The handle a worker puts on the queue; unpickled, it is the batch itself."""

    def __init__(
        self, token: str, pid: int, slot: int, generation: int, seq: int,
        storage: torch.Tensor | None, skeleton: Any,
    ) -> None:
        self.args = (token, pid, slot, generation, seq, storage, skeleton)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        token, pid, slot, generation, seq, storage, skeleton = self.args
        return _rebuild, (token, pid, slot, generation, seq, storage, skeleton)


PINNED: set[str] = set()
"""Tokens of the loaders whose batches the DataLoader pins: a slot's tensors are rebuilt
over one pinned copy of the slot's bytes (``handover.pinned``), and the slot goes back to
its worker at once, instead of each tensor pinned on its own by the DataLoader's thread."""
_MAPPED: dict[tuple[str, int, int], tuple[int, torch.Tensor, UInt8Array]] = {}
"""Main process: ``(token, worker pid, slot) -> (generation, storage, its bytes)``."""
_OWNERS: dict[int, type[ctypes.Array[ctypes.c_char]]] = {}


def _rebuild(
    token: str, pid: int, slot: int, generation: int, seq: int,
    storage: torch.Tensor | None, skeleton: Any,
) -> Any:
    """In the main process: the batch over the slot's memory, released when all of it is gone."""
    if slot == NO_SLOT:  # nothing in shared memory to give back
        return _Builder(None).build(skeleton)
    key = (token, pid, slot)
    if storage is not None:
        _MAPPED[key] = (generation, storage, storage.numpy())
    mapped = _MAPPED.get(key)
    if mapped is None or mapped[0] != generation:
        raise RuntimeError(
            f"shardio.loader: a batch names slot {slot} (generation {generation}) of worker "
            f"{pid}, which this process has not mapped; the loader forgot that worker's "
            "segments while it was still delivering (a bug: please report it)"
        )
    whole = mapped[2]
    if token in PINNED:
        extent = _tensor_extent(skeleton)
        if extent is not None:  # tensors only: a RecordBatch is never pinned, kept as views
            size = min(-(-extent // 64) * 64, whole.size - HEADER_BYTES)
            flat = pinned.empty(size)
            flat.numpy()[:] = whole[HEADER_BYTES : HEADER_BYTES + size]
            _release(whole[:16].view(np.int64), seq)
            return _Builder(None, flat).build(skeleton)
    size = whole.size - HEADER_BYTES
    owner_type = _OWNERS.get(size)
    if owner_type is None:
        owner_type = _OWNERS[size] = ctypes.c_char * size
    owner = owner_type.from_buffer(whole.data, HEADER_BYTES)
    weakref.finalize(owner, _release, whole[:16].view(np.int64), seq)
    return _Builder(owner).build(skeleton)


def _release(state: npt.NDArray[np.int64], seq: int) -> None:
    state[1] = seq


def _tensor_extent(skeleton: Any) -> int | None:
    """Bytes of a slot up to the end of its last tensor; None if it holds anything else."""
    kind = skeleton[0]
    if kind == "t":
        _, at, dtype, shape, stride = skeleton
        if 0 in shape:
            return 0
        span = sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1
        return int(at + span * torch.empty((), dtype=dtype).element_size())
    if kind in ("u", "l"):
        ends = [_tensor_extent(v) for v in skeleton[1]]
        return None if None in ends else max((e for e in ends if e is not None), default=0)
    if kind == "d":
        ends = [_tensor_extent(v) for _, v in skeleton[1]]
        return None if None in ends else max((e for e in ends if e is not None), default=0)
    return 0 if kind == "v" else None


class _Builder:
    """Rebuilds a skeleton over one batch's owner (every view keeps the owner alive)."""

    def __init__(
        self, owner: ctypes.Array[ctypes.c_char] | None, flat: torch.Tensor | None = None
    ) -> None:
        self.owner = owner
        self._bytes: UInt8Array | None = None
        # flat: the batch's bytes already in a uint8 tensor of their own (a pinned copy)
        self._typed: dict[torch.dtype, torch.Tensor] = {} if flat is None else {
            torch.uint8: flat}

    def build(self, skeleton: Any) -> Any:
        kind = skeleton[0]
        if kind == "t":
            _, at, dtype, shape, stride = skeleton
            typed = self._typed.get(dtype)
            if typed is None:
                flat = self._typed.get(torch.uint8)
                if flat is None:
                    assert self.owner is not None
                    flat = torch.frombuffer(self.owner, dtype=torch.uint8)
                    self._typed[torch.uint8] = flat
                typed = self._typed[dtype] = flat.view(dtype)
            return torch.as_strided(typed, shape, stride, at // typed.element_size())
        if kind == "r":
            if self._bytes is None:
                assert self.owner is not None
                self._bytes = np.frombuffer(cast(Any, self.owner), np.uint8)
            return RecordBatch.from_shared(self._bytes, skeleton[2])
        if kind == "f":
            return file_batch(skeleton)
        if kind == "u":
            return tuple(self.build(v) for v in skeleton[1])
        if kind == "l":
            return [self.build(v) for v in skeleton[1]]
        if kind == "d":
            return {k: self.build(v) for k, v in skeleton[1]}
        return skeleton[1]


_FILES: dict[tuple[str, int, int], memoryview] = {}
"""Main process: a view of its map of each shard file batches came in, by ``(path, dev, inode)``."""
DROP_BYTES = 64 << 20
"""Bytes of samples handed out between two drops of the shard maps' pages from this
process: a consumer that reads them maps them here (file pages, counted in its RSS),
so they are bounded by about this much beyond the batches it holds; a view still
held maps its bytes again on its next touch. One call per shard file mapped here
each time (a few dozen per 64 MB)."""
_HANDED = [0]
_EMPTY = memoryview(b"")


def _mapped_file(file: tuple[str, int, int], handle: Any = None) -> memoryview:
    """This process's view of a shard file the worker read; raises if it is another file.

    ``handle``: the worker's descriptor of the file (a ``DupFd``, fetched here even
    where the file is mapped already, which frees the worker's duplicate); without
    one, a file not mapped yet is opened by path (``shmring._MappedFiles._handles``).
    """
    fd = _fetched(handle) if handle is not None else None
    view = _FILES.get(file)
    if view is not None:
        if fd is not None:
            os.close(fd)
        return view
    fd = _checked(file, fd)
    try:
        size = os.fstat(fd).st_size
        view = _FILES[file] = memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)
    return view


def _checked(file: tuple[str, int, int], fd: int | None) -> int:
    """A descriptor of ``file`` (``fd``, or opened by path), checked to be the file the
    worker read; raises (closing it) where it is another."""
    path, dev, inode = file
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (dev, inode):
        os.close(fd)
        raise RuntimeError(
            f"shardio: {path} is not the file a DataLoader worker read (inode {inode} there, "
            f"{st.st_ino} here): the dataset was rewritten while it was read; restart the "
            "loader on the new dataset"
        )
    return fd


_READS: OrderedDict[tuple[str, int, int], int] = OrderedDict()
"""Main process: a descriptor of each shard file ``FileBytes`` values came from, checked once
(``_checked``), the least recently used closed beyond ``MAX_READ_FILES``."""
_READS_LOCK = threading.Lock()
MAX_READ_FILES = 128
"""Descriptors ``file_bytes`` keeps: a dataset of thousands of shards must not use up the
process's limit on open files (often 1,024)."""


def file_bytes(file: tuple[str, int, int], offset: int, length: int, handle: Any = None,
               ) -> bytes:
    """A ``FileBytes`` that crossed as its place (``shmring._reduce_file_bytes``): its bytes,
    read from the file (``handle``: the worker's descriptor of it, sent with the first
    value naming it). Raises if that is another file, or shorter than the worker read.

    Read, not copied out of a map of the file: mapping each value's pages into this
    process and dropping them again cost more than the read (2 workers through a plain
    DataLoader on the 8,000-image tree: about a quarter of this process's time).
    """
    fd = _fetched(handle) if handle is not None else None
    with _READS_LOCK:  # a pin-memory thread unpickles too; no descriptor closed mid-read
        known = _READS.get(file)
        if known is not None:
            if fd is not None:
                os.close(fd)
            _READS.move_to_end(file)
        else:
            known = _READS[file] = _checked(file, fd)
            while len(_READS) > MAX_READ_FILES:
                os.close(_READS.popitem(last=False)[1])
        out = os.pread(known, length, offset)
    if len(out) != length:
        raise RuntimeError(
            f"shardio: {file[0]} ends before byte {offset + length}, where a DataLoader "
            "worker read a sample: the dataset was rewritten while it was read; restart the "
            "loader on the new dataset"
        )
    return out


def _fetched(handle: Any) -> int | None:
    """The descriptor a ``DupFd`` brings from its worker, or None where it cannot.

    A worker gone (shut down or killed after it queued the batch) takes its end of
    the socket with it; the file is then opened by path, as it was before descriptors
    were sent, so a descriptor that never comes only costs that open.
    """
    try:
        return int(handle.detach())
    # connection refused or cut, a failed handshake, a message without a descriptor
    except (OSError, EOFError, RuntimeError, multiprocessing.ProcessError):
        return None


def drop_pages() -> None:
    """Drop this process's pages of every shard map batches came in (``DROP_BYTES``).

    Also called at an epoch's end, so the pages an epoch's last batches mapped do not
    stay counted in this process's RSS into the next epoch (up to ``DROP_BYTES``,
    depending on where in the count the epoch ended). Views still held read on.
    """
    _HANDED[0] = 0
    if hasattr(mmap, "MADV_DONTNEED"):
        for mapped in _FILES.values():
            cast(mmap.mmap, mapped.obj).madvise(mmap.MADV_DONTNEED)


def file_batch(skeleton: list[Any]) -> RecordBatch:
    """A batch that crossed as places in shard files (``shmring._MappedFiles.describe``):
    its samples are views of this process's maps of those files."""
    (_, files, handles, n, count, table, offset_names, int_names, others, order, missing,
     key_text) = skeleton
    where, starts, sizes = table[:count], table[count : 2 * count], table[2 * count : 3 * count]
    at = 3 * count
    indices = table[at : at + n]
    at += n
    offsets: dict[str, npt.NDArray[np.int64]] = {}
    for name in offset_names:
        offsets[name] = table[at : at + n + 1]
        at += n + 1
    columns: dict[str, npt.NDArray[np.int64]] = {}
    for name in int_names:
        columns[name] = table[at : at + n]
        at += n
    if handles is not None:  # the first batch naming some of its files
        views = [_mapped_file(f, h) for f, h in zip(files, handles, strict=True)]
    else:
        known = _FILES.get
        views = [known(f) or _mapped_file(f) for f in files]  # a batch names a few dozen
    views.append(_EMPTY)  # file -1: a field the sample lacks
    per_piece = itemgetter(*where.tolist())(views) if count > 1 else [views[int(where[0])]]
    pieces: list[bytes | memoryview] = [
        view[a : a + size]
        for view, a, size in zip(per_piece, starts.tolist(), sizes.tolist(), strict=True)]
    _HANDED[0] += int(sizes.sum())
    if _HANDED[0] >= DROP_BYTES:
        drop_pages()
    values = {name: columns[name] if name in columns else others[name] for name in order}
    batch = RecordBatch(None, indices, pieces, offsets, values, missing=missing)
    batch._key_blob = (key_text, table[at : at + n + 1])
    return batch


def forget(token: str, keep: set[int] | None = None) -> None:
    """Drop the mapped segments of ``token``'s workers (all, or all but ``keep``).

    Batches still held keep their own segment mapped until they are dropped.
    """
    if keep is None:
        PINNED.discard(token)
    # list(dict) copies the keys in one step: a pin-memory thread may be adding one meanwhile
    for key in list(_MAPPED):
        if key[0] == token and (keep is None or key[1] not in keep):
            _MAPPED.pop(key, None)
