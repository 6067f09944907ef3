"""Record checksums computed on a thread, ahead of the reader, in the order runs will be read.

On a warm local epoch of 80 KB images, CRC-32C over every byte is the largest
single cost per sample (``benchmarks/README.md``, "Record checksums"): it is
memory bandwidth, not Python, so no encoding makes it much cheaper. It does not
need the interpreter, though: the ``crc32c`` and ``zlib`` functions release the
GIL on large buffers, and so does zstd. So the stream hands each window's runs, in
the order their first samples are due, to one thread per process that checks them
(v3: each block's; v1/v2: each record's) while the reader decodes and hands out
earlier ones; the reader then takes a run's result before it decodes the run, and
decodes only runs that passed. A run that failed is checked again where it is
read, which names the record and raises. The thread touching a run's pages first
also maps them into the process, so the reader does not stop on those page faults.
A reader that needs a run the thread has not started runs its check itself.
The stream queues a window's runs once the window before it has handed out its
first samples, so the thread checks them while that one is handed out.

The thread pays only where a core is free for it (``StreamingDataset`` uses it
while its reading processes are fewer than the CPUs). Only runs that are already
in memory are handed over: views of a mapped local shard, and of a remote range
that the node cache holds when the window is planned (a later epoch's, or a later
window's once its range has come; where the budget holds the dataset); any other
remote range is checked where it arrives. The thread belongs to the process that started it: a
forked child (a DataLoader worker) starts its own and never touches the one it
inherited. Torch-free.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
from collections.abc import Callable

from shardio.format.frames import RunBytes, first_failing

_PENDING, _RUNNING, _DONE, _CANCELLED = 0, 1, 2, 3


class Check:
    """One run's checksum, computed on the checker thread (or by the reader, if it gets
    there first: a reader waiting for a check not yet started runs it itself, so on two
    cores the two share the checking whichever is ahead)."""

    __slots__ = ("_claim_lock", "_done", "_finished", "_state", "error", "failing", "result",
                 "run", "work")

    def __init__(self, run: RunBytes | None, claim_lock: threading.Lock,
                 work: Callable[[RunBytes], object] | None = None) -> None:
        self.run: RunBytes | None = run
        self._claim_lock = claim_lock
        """Taken to move the check from pending to running, so it runs once."""
        self.work = work
        """What to run instead of ``first_failing``: a function of the run that checks it
        (raising where it fails) and returns what the reader wants of it, kept as
        ``result``."""
        self.failing: int | None = None
        """The first record (position in the run) whose checksum fails; None: all pass."""
        self.result: object = None
        self.error: BaseException | None = None
        self._state = _PENDING
        # held until the result is in: a lock costs a tenth of an Event (a Condition and a
        # lock) to make, and a window makes one check a run
        self._done = threading.Lock()
        self._done.acquire()
        self._finished = False

    def passed(self) -> bool:
        """The result (computed here if the thread has not started it): True when every
        record of the run passed its checksum."""
        if not self._finished:
            self._work()
            with self._done:  # until the thread that runs it is through
                pass
        return self._state == _DONE and self.error is None and self.failing is None

    def run_if_pending(self) -> None:
        """Run the check on this thread now unless it was started or cancelled elsewhere."""
        self._work()

    def cancel(self) -> None:
        """Not wanted any more: skipped if not started (a started one runs to its end)."""
        with self._claim_lock:
            if self._state == _PENDING:
                self._state = _CANCELLED
                self.run = None
                self._finish()

    def _claim(self) -> RunBytes | None:
        with self._claim_lock:
            if self._state != _PENDING:
                return None
            self._state = _RUNNING
            return self.run

    def _work(self) -> bool:
        """Run the check unless it was started or cancelled elsewhere; whether it ran here."""
        run = self._claim()
        if run is None:
            return False
        try:
            if self.work is None:
                self.failing = first_failing(run)
            else:
                self.result = self.work(run)
        except BaseException as exc:  # the reader checks the run itself, which names it
            self.error = exc
        finally:
            self._state = _DONE
            self.run = self.work = None
            self._finish()
        return True

    def _finish(self) -> None:
        self._finished = True
        self._done.release()


PASSED = Check(None, threading.Lock())
"""A check already made where the run was read (its frames checked there)."""
PASSED._state = _DONE
PASSED._finish()


class Checker:
    """The checker thread of this process, and its queue of runs."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._claim_lock = threading.Lock()
        self.checked = 0
        """Runs whose checksums this thread computed (not those the reader took over)."""
        self._jobs: queue.SimpleQueue[Check | _Later] = queue.SimpleQueue()
        self._first: collections.deque[_Later] = collections.deque()
        """Jobs of ``later``, run before the next queued check."""
        # a daemon: a reader that stops mid-window must not keep the interpreter alive
        threading.Thread(target=self._loop, name="shardio-check", daemon=True).start()

    def submit(self, run: RunBytes, work: Callable[[RunBytes], object] | None = None) -> Check:
        """Queue ``run``'s checksums (or ``work``, see ``Check.work``) behind those queued
        before it."""
        check = Check(run, self._claim_lock, work)
        self._jobs.put(check)
        return check

    def later(self, job: Callable[[], None]) -> None:
        """Run ``job`` on this thread before the checks still queued (a window's page drop,
        ``RecordsShardReader.drop_pages``: behind the next window's checks, the closed
        window stayed mapped beside the next one, a window more of resident memory); an
        error it raises is dropped with it."""
        self._first.append(_Later(job))
        self._jobs.put(_WAKE)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the jobs of ``later`` queued so far have run; whether they did within
        ``timeout`` seconds."""
        done = threading.Event()
        self.later(done.set)
        return done.wait(timeout)

    def _loop(self) -> None:
        first = self._first
        while True:
            job = self._jobs.get()
            while first:
                first.popleft()._work()
            self.checked += job._work()


class _Later:
    """A job of ``Checker.later`` (``_WAKE``: none, it wakes the thread for those)."""

    __slots__ = ("job",)

    def __init__(self, job: Callable[[], None]) -> None:
        self.job = job

    def _work(self) -> bool:
        # nothing waits for it: an error must not stop the thread's checks
        with contextlib.suppress(Exception):
            self.job()
        return False


_WAKE = _Later(lambda: None)

_CHECKER: Checker | None = None
_LOCK = threading.Lock()


def checker() -> Checker:
    """This process's checker (started on first use; a new one after a fork)."""
    global _CHECKER
    found = _CHECKER
    if found is not None and found.pid == os.getpid():
        return found
    with _LOCK:
        if _CHECKER is None or _CHECKER.pid != os.getpid():
            _CHECKER = Checker()
        return _CHECKER


def _after_fork_in_child() -> None:
    # the parent's thread is not in the child, and a lock it held at the fork stays held
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
