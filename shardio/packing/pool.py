"""Run ``build_shard`` for many shards: in this process, or one shard at a time per forked worker.

Workers inherit the ``ShardJob`` by ``fork`` (nothing large is pickled). Each
gets one shard number at a time over its own pipe, builds the whole shard and
sends back only its small result, which ``build_shards`` yields as shards
finish, in whatever order that is; a worker that is done gets the next number.
Progress flows through two shared counters, not the pipes. A worker that dies
(killed, out of memory) stops the pack with a ``PackError`` instead of a lost
task; when the caller stops early (an exception, Ctrl-C, a bad file) every
worker is killed and the temporary files of the shards in flight are removed.
A worker whose parent is killed dies with it: by ``PR_SET_PDEATHSIG``, and,
as that signal was seen not to arrive on Linux 6.18, by checking its parent
every ``shardbuild.REPORT_EVERY`` files. ``ProgressBar`` shows what the
progress callback reports. This module imports no shardio module but
``backends``, ``errors`` and ``shardbuild``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Final

from shardio.backends import shard_name
from shardio.errors import PackError
from shardio.packing.build import ShardJob, ShardOutcome, build_shard

POLL_S: Final = 0.2
"""How often the main process refreshes progress while it waits for shards."""

Progress = Callable[[int, int], None]
"""``progress(files, input_bytes)``: totals handled so far by this run."""

class ProgressBar:
    """One tqdm bar (files, MB/s, ETA) on stderr, or nothing."""

    def __init__(self, enabled: bool, total: int, initial: int) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="file", unit_scale=True,
                            desc="pack", file=sys.stderr)
        self.initial = initial
        self.start = time.perf_counter()

    def show(self, files: int, nbytes: int) -> None:
        """This run has handled ``files`` input files of ``nbytes`` bytes so far."""
        if self.bar is None:
            return
        mb_s = nbytes / 1e6 / max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{mb_s:.1f} MB/s", refresh=False)
        self.bar.update(self.initial + files - self.bar.n)

    def close(self) -> None:
        """Close the bar (leaves it on the terminal)."""
        if self.bar is not None:
            self.bar.close()


def default_workers() -> int:
    """Every core this process may run on: the main process only waits while workers build."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _serve(job: ShardJob, conn: Connection, parent_end: Connection, counters: Any) -> None:
    """A worker: build each shard number received until ``None``; send back each outcome."""
    import ctypes  # only pool workers need it

    parent_end.close()  # so that ``recv`` ends when the parent does
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        # PR_SET_PDEATHSIG: a worker dies with a parent killed by SIGKILL instead of lingering
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)

    def report(files: int, nbytes: int) -> None:
        if os.getppid() != parent:  # orphaned: PR_SET_PDEATHSIG is not always delivered
            os._exit(1)
        if counters is not None:
            with counters.get_lock():
                counters[0] += files
                counters[1] += nbytes

    with contextlib.suppress(EOFError):  # the parent is gone
        while (number := conn.recv()) is not None:
            try:
                outcome: ShardOutcome | BaseException = build_shard(job, number, report)
            except Exception as exc:  # the parent re-raises it, as if built in-process
                outcome = exc
            conn.send(outcome)


def build_shards(
    job: ShardJob, numbers: Sequence[int], *, num_workers: int, progress: Progress | None = None
) -> Generator[ShardOutcome, None, None]:
    """Build shards ``numbers`` of ``job``; yield each outcome once its shard is on disk.

    With one worker (or one shard) everything runs in this process, in order.
    Close the generator to stop early: workers are killed and the temporary
    files of the shards they were building are removed.

    Raises:
        PackError: a worker died without an answer (killed, out of memory…).
    """
    if num_workers <= 1 or len(numbers) <= 1:
        yield from _build_here(job, numbers, progress)
        return
    import multiprocessing  # only workers need it; `import shardio` stays lighter

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    counters = ctx.Array("q", 2) if progress is not None else None
    todo = deque(numbers)
    workers: dict[Connection, Any] = {}
    """Every worker process, listed before it starts: the cleanup below must see them all."""
    assigned: dict[Connection, int] = {}
    """The shard each busy worker builds, recorded before the number is sent (see ``_assign``)."""
    try:
        for _ in range(min(num_workers, len(numbers))):
            conn, child = ctx.Pipe()
            process = ctx.Process(  # type: ignore[attr-defined]  # typeshed: only on subclasses
                target=_serve, args=(job, child, conn, counters), daemon=True)
            workers[conn] = process
            process.start()
            child.close()
            _assign(conn, todo, assigned)
        while assigned:
            sentinels = {workers[conn].sentinel: conn for conn in assigned}
            ready = wait([*assigned, *sentinels], timeout=POLL_S)
            if progress is not None and counters is not None:
                progress(counters[0], counters[1])
            for conn in [r for r in ready if isinstance(r, Connection)] + [
                    sentinels[r] for r in ready if isinstance(r, int)]:
                if conn not in assigned:
                    continue
                process, number = workers[conn], assigned[conn]
                try:
                    outcome = conn.recv() if conn.poll() else None
                except EOFError:
                    outcome = None
                if outcome is None:
                    process.join()
                    raise PackError(
                        f"{job.out}: the worker building shard {number} died (exit code "
                        f"{process.exitcode}); run the same command with --resume to finish",
                        path=job.out)
                if isinstance(outcome, BaseException):
                    raise outcome
                del assigned[conn]  # idle: its shard is on disk
                yield outcome
                if todo:
                    _assign(conn, todo, assigned)
    finally:
        _stop(job, workers, assigned)


def _assign(conn: Connection, todo: deque[int], assigned: dict[Connection, int]) -> None:
    """Send the next shard number to ``conn``'s worker, recording it first.

    Ctrl-C can raise ``KeyboardInterrupt`` anywhere, also right after the send;
    recorded first, the shard is known to be in flight, so ``_stop`` kills its
    worker and removes its temporary file (a test interrupts exactly there).
    """
    number = todo.popleft()
    assigned[conn] = number
    conn.send(number)


def _stop(job: ShardJob, workers: dict[Connection, Any], assigned: dict[Connection, int]) -> None:
    """Kill the workers building shards, remove their temporary files; let idle ones exit."""
    started = {conn: p for conn, p in workers.items() if p.pid is not None}
    for conn in workers.keys() - started.keys():
        conn.close()
    for conn, process in started.items():
        if conn in assigned:
            process.kill()
        else:
            with contextlib.suppress(OSError):
                conn.send(None)
    for conn, process in started.items():
        process.join()
        if conn in assigned:  # killed and joined: nothing writes the file any more
            (job.out / f".{shard_name(job.backend, assigned[conn])}.tmp").unlink(missing_ok=True)
        conn.close()


def _build_here(
    job: ShardJob, numbers: Sequence[int], progress: Progress | None
) -> Generator[ShardOutcome, None, None]:
    totals = [0, 0]

    def report(files: int, nbytes: int) -> None:
        assert progress is not None
        totals[0] += files
        totals[1] += nbytes
        progress(totals[0], totals[1])

    for number in numbers:
        yield build_shard(job, number, report if progress is not None else None)
