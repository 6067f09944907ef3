"""Reused buffers for a window's inflated payloads, taken back only once nothing views them.

A local window's compressed records are inflated shard by shard into one buffer (the
vectorised parse reads them there), and their bytes values are views of it, cut a batch
at a time, as a mapped record's are views of its map. A fresh buffer for each shard's
payloads cost more than copying every value out of a reused one: a window's buffers are
alive together, so each new one came from pages the process had never touched (or had
given back to the kernel), and faulting them in was about a seventh of a warm epoch of
tiny records (100,000 of 1-4 KB, one process). So a closed window's buffers come here
and are filled again by the next window.

A buffer is an ``io.BytesIO``: ``writelines`` fills it from the inflated pieces in one C
loop, without a Python call a piece, and ``getbuffer`` views it. While any view of it is
alive (a batch or a sample a consumer kept), ``write`` refuses with ``BufferError``, so a
buffer still viewed is never refilled: it waits here until its views are gone, or is let
go once more than ``MAX_IDLE`` buffers (or ``MAX_IDLE_BYTES``) wait. Torch-free.
"""

from __future__ import annotations

import collections
import io
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

MAX_IDLE = 64
"""Buffers kept for reuse (a window holds one a shard); beyond that the oldest are let go."""
MAX_IDLE_BYTES = 256 << 20
"""Bytes kept for reuse, about the default shuffle window's records; beyond that the oldest
buffers are let go."""

_idle: collections.deque[io.BytesIO] = collections.deque()
_lock = threading.Lock()
created = 0
"""Buffers made since the process started (the rest were reused)."""


def joined(pieces: Iterable[Any]) -> tuple[memoryview, io.BytesIO]:
    """``pieces`` (bytes-like) back to back in a buffer not viewed by anything, as a view of
    them and the buffer itself, to ``give_back`` when nothing is to be cut from it any more.
    """
    buffer = _take()
    buffer.seek(0)
    buffer.writelines(pieces)
    size = buffer.tell()
    return buffer.getbuffer()[:size], buffer


def give_back(buffers: Sequence[io.BytesIO]) -> None:
    """Buffers of ``joined`` whose owner is done with them; each is refilled once nothing
    views it."""
    if not buffers:
        return
    with _lock:
        _idle.extend(buffers)
        # the garbage collector finalizes (closes) the buffers of a window dropped in a
        # reference cycle, such as an exception's traceback, in any order with the
        # generator whose ``finally`` gives them back: a closed one is no use again
        live = [buffer for buffer in _idle if not buffer.closed]
        _idle.clear()
        _idle.extend(live)
        held = sum(buffer.seek(0, io.SEEK_END) for buffer in _idle)
        while len(_idle) > MAX_IDLE or held > MAX_IDLE_BYTES:
            held -= _idle.popleft().seek(0, io.SEEK_END)


def _take() -> io.BytesIO:
    global created
    with _lock:
        for _ in range(len(_idle)):
            buffer = _idle.popleft()
            if buffer.closed:  # finalized after it was given back (see give_back)
                continue
            try:
                buffer.write(b"")  # refused while a view of it is alive
            except BufferError:
                _idle.append(buffer)
                continue
            return buffer
        created += 1
    return io.BytesIO()


def _after_fork_in_child() -> None:
    # a lock held by another thread at the fork stays held in the child
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
