"""How the processes of a node share one cache budget: read-ahead yields to downloads that wait.

Every reading process sizes its read-ahead to the budget (``shardsource``
divides it among the workers of its own job, and cannot know of other jobs),
so jobs sharing a cache folder each held the whole budget ahead of themselves,
waited for each other's ranges, and both failed after two minutes. Read-ahead
is therefore a guest:

* a download ahead (``reading_ahead``, with its ``AheadTicket``) waits for room
  with no deadline until its reader wants it, then like any download, and gives
  up when its reader passes it over; while it is not wanted it takes no space
  as long as any download waits for some (``waiting``);
* a download that waits for space says so with a file in ``waiting/``
  (``waiter``: ``<pid>-<token>.<bytes>``, flock'd while it waits, so the file of
  a dead process is known as such); its own process gives back ranges held
  ahead at once (``give_back_ahead``), and once it has waited ``YIELD_AFTER_S``
  so does every holder whose reader has taken nothing for as long: a DataLoader
  worker whose sibling waits is idle (the loader waits for that sibling's
  samples), and the ranges it held ahead were what the sibling waited for. A
  holder still reading releases ranges as it goes. A daemon thread per process
  and cache folder watches for that (``held_ahead`` starts it; it ends once
  nothing is held ahead).

Holders give back the ranges furthest ahead first; they are downloaded again when
their turn comes if evicted meanwhile. Imports nothing from shardio.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

WAITING = "waiting"
YIELD_AFTER_S = 1.0
"""How long a download waits for space, and an idle reader took nothing, before the idle
reader's process gives back what it holds ahead: waits for a sibling's progress must not
cost ranges downloaded again (each range is downloaded once per node under half a
budget, 8 workers: ``tests/reading/test_remote_budget.py``)."""
WATCH_S = 0.1
"""How often a process holding ranges ahead looks for downloads waiting on it."""


class AheadHolder(Protocol):
    """Holds ranges for a reader before it asks for them (``readahead.ReadAhead``)."""

    @property
    def held_ahead(self) -> int:
        """Bytes of the ranges held only ahead of the reader."""

    @property
    def idle_s(self) -> float:
        """Seconds since the reader last took a range."""

    def give_back(self, num_bytes: int) -> int:
        """Release ranges held only ahead of the reader, the furthest ahead first, until
        ``num_bytes`` are released or none is left; the bytes released."""


class AheadTicket:
    """The standing of one read-ahead download: its reader does not need it yet, needs it
    now (``want``), or will never take it (``drop``)."""

    def __init__(self) -> None:
        self._decided = threading.Event()
        self.dropped = False

    @property
    def wanted(self) -> bool:
        """Whether the reader waits for this download now."""
        return self._decided.is_set() and not self.dropped

    def want(self) -> None:
        """The reader waits for it: from now on it reserves like any download."""
        self._decided.set()

    def drop(self) -> None:
        """The reader will never take it: a reservation still waiting gives up."""
        self.dropped = True
        self._decided.set()

    def wait(self, timeout_s: float) -> None:
        """Sleep ``timeout_s``, or less if the reader decides meanwhile."""
        self._decided.wait(timeout_s)


_HOLDERS: weakref.WeakKeyDictionary[AheadHolder, str] = weakref.WeakKeyDictionary()
"""This process's read-ahead holders, by the cache folder they hold ranges of."""
_THREAD = threading.local()
_WATCHERS: set[str] = set()
"""Cache folders this process's watcher threads watch."""
_WATCH_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child has no watcher threads, and a parent thread may have held the lock."""
    global _WATCH_LOCK
    _WATCH_LOCK = threading.Lock()
    _WATCHERS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def hold_ahead(root: str | os.PathLike[str], holder: AheadHolder) -> None:
    """Register ``holder``, which holds ranges ahead in the cache folder ``root``."""
    _HOLDERS[holder] = os.path.abspath(root)


def held_ahead(root: str | os.PathLike[str]) -> None:
    """Say that a holder of ``root`` now holds a range ahead: watch for downloads waiting."""
    folder = os.path.abspath(root)
    with _WATCH_LOCK:
        if folder in _WATCHERS:
            return
        _WATCHERS.add(folder)
    threading.Thread(target=_watch, args=(folder,), name="shardio-cache-yield",
                     daemon=True).start()


@contextmanager
def reading_ahead(ticket: AheadTicket) -> Iterator[None]:
    """Make this thread's reservations read-ahead ones, standing as ``ticket`` says."""
    before = getattr(_THREAD, "ahead", None)
    _THREAD.ahead = ticket
    try:
        yield
    finally:
        _THREAD.ahead = before


def current_ticket() -> AheadTicket | None:
    """The ticket of the read-ahead download this thread reserves for, if any."""
    ticket: AheadTicket | None = getattr(_THREAD, "ahead", None)
    return ticket


def give_back_ahead(root: str, num_bytes: int, *, idle_s: float = 0.0) -> int:
    """Have this process's holders of ``root`` (an absolute path) whose readers took
    nothing for ``idle_s`` release ``num_bytes`` they hold ahead, or all they hold if
    less; the bytes released."""
    released = 0
    for holder, held_root in list(_HOLDERS.items()):
        if held_root == root and released < num_bytes and holder.idle_s >= idle_s:
            released += holder.give_back(num_bytes - released)
    return released


def _watch(root: str) -> None:
    """Give back what the downloads of other processes into ``root`` wait for, once they
    have waited ``YIELD_AFTER_S``; end once nothing is held ahead."""
    while True:
        time.sleep(WATCH_S)
        with _WATCH_LOCK:
            if not any(holder.held_ahead for holder, held_root in list(_HOLDERS.items())
                       if held_root == root):
                _WATCHERS.discard(root)
                return
        need = waited_for(root, older_than_s=YIELD_AFTER_S, others_only=True)
        if need:
            give_back_ahead(root, need, idle_s=YIELD_AFTER_S)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except FileNotFoundError:  # removed with the cache folder
        return []


def waited_for(root: str | os.PathLike[str], *, older_than_s: float = 0.0,
               others_only: bool = False) -> int:
    """Bytes that downloads into ``root`` wait for now (their waiting files deleted where
    their process died): all, or those waiting at least ``older_than_s``, of other
    processes only with ``others_only``."""
    total = 0
    mine = f"{os.getpid()}-"
    now = time.time()
    for entry in _entries(Path(root) / WAITING):
        if entry.name.startswith(".") or (others_only and entry.name.startswith(mine)):
            continue  # one being made (locked before it is named), or this process's
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its download waits
            if now - os.fstat(fd).st_mtime >= older_than_s:
                _head, _dot, size = entry.name.rpartition(".")
                total += int(size) if size.isdigit() else 1
        else:  # nobody waits on it: its process died
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        finally:
            os.close(fd)
    return total


@contextmanager
def waiter(root: str | os.PathLike[str], num_bytes: int) -> Iterator[None]:
    """Say, while inside, that a download of this process waits for ``num_bytes``."""
    name = f"{os.getpid()}-{secrets.token_hex(4)}.{num_bytes}"
    path = Path(root) / WAITING / name
    try:
        fd = os.open(path.with_name(f".{name}"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:  # the cache folder was removed: read-ahead yields a moment less
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # before it is named: no one takes it for a dead one's
        with contextlib.suppress(FileNotFoundError):  # the cache folder was removed
            os.rename(path.with_name(f".{name}"), path)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
