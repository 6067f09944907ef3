"""The local engine: walk tasks and shard builds in processes forked on this machine.

With ``PARALLEL_SCAN_WORKERS`` workers or more, the walk (``shardio.packing.scan``)
runs in a pool of ``num_workers`` forked processes, started only when the tree
is larger than what one task walks; each task's part comes back through a pipe
as msgpack. With fewer, SRC is walked in this process: on a warm local disk a
file costs about 2 µs to walk and 2 µs to group, and moving its part between
processes plus rebuilding the sample about 2 µs more, so two cores (one of
which also runs this process) walk no faster than one (``python -m
benchmarks.bench_pack --scan-only``). Threads (``scan_with="threads"``) were
slower still: ``scandir`` and ``lstat`` release the GIL, the Python work
around each entry does not. Shards are built by ``shardio.packing.pool``'s
workers, forked after planning so that they inherit the job. With one worker
everything runs in this process.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
from collections.abc import Generator, Sequence
from typing import Final, Literal

from shardio.packing.build import ShardJob, ShardOutcome, ShardResult
from shardio.packing.pool import Progress, build_shards, default_workers
from shardio.packing.scan import MAX_ENTRIES, ScanPart, WalkSpec, walk_part, walk_task
from shardio.packing.sources.files import PackSource, scan_source
from shardio.packing.target import PackTarget
from shardio.packing.walk import Folder


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us


class ExecutorWalkPool:
    """A ``WalkPool`` over a process or thread pool that starts with the first task."""

    def __init__(self, slots: int, *, kind: Literal["processes", "threads"],
                 max_entries: int = MAX_ENTRIES) -> None:
        self.slots = slots
        self.max_entries = max_entries
        self.kind = kind
        self._executor: cf.Executor | None = None
        self._running: set[cf.Future[ScanPart | bytes]] = set()

    def submit(self, spec: WalkSpec, folders: list[Folder]) -> None:
        """Start a walk of ``folders`` (and the pool, the first time)."""
        if self._executor is None:
            if self.kind == "threads":
                self._executor = cf.ThreadPoolExecutor(self.slots, "shardio-walk")
            else:
                method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
                self._executor = cf.ProcessPoolExecutor(
                    self.slots, multiprocessing.get_context(method), _ignore_sigint)
        task = walk_part if self.kind == "threads" else walk_task  # a process sends msgpack
        self._running.add(self._executor.submit(task, spec, folders, self.max_entries))

    def next_done(self) -> ScanPart:
        """The part of a finished walk task; re-raises its error."""
        done, _ = cf.wait(self._running, return_when=cf.FIRST_COMPLETED)
        future = done.pop()
        self._running.discard(future)
        part = future.result()
        return part if isinstance(part, ScanPart) else ScanPart.from_bytes(part)

    def close(self) -> None:
        """Stop the pool: tasks not started are dropped, running ones are waited for."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


PARALLEL_SCAN_WORKERS: Final = 3
"""The fewest workers whose walk runs in a pool by default (see the module docstring)."""

ScanWith = Literal["processes", "threads", "serial"]


class LocalEngine:
    """Walk and build on this machine with ``num_workers`` processes (default: every core).

    ``scan_with`` chooses how SRC is walked: ``"processes"``, ``"threads"`` or
    ``"serial"`` (here); ``None`` picks processes from ``PARALLEL_SCAN_WORKERS``
    workers on, else serial.
    """

    name = "local"

    def __init__(self, num_workers: int | None = None, *, scan_with: ScanWith | None = None,
                 max_walk_entries: int = MAX_ENTRIES) -> None:
        self.num_workers = num_workers or default_workers()
        if scan_with is None:
            scan_with = "processes" if self.num_workers >= PARALLEL_SCAN_WORKERS else "serial"
        self.scan_with: ScanWith = scan_with
        self.max_walk_entries = max_walk_entries

    def scan(
        self, src: str | os.PathLike[str], *, imagefolder: bool | None, include: Sequence[str],
        exclude: Sequence[str], follow_symlinks: bool, class_folders: bool = False,
    ) -> PackSource:
        """``scan_source``, its walk split over ``num_workers`` processes or threads."""
        if self.num_workers <= 1 or self.scan_with == "serial":
            return scan_source(src, imagefolder=imagefolder, include=include, exclude=exclude,
                               follow_symlinks=follow_symlinks, class_folders=class_folders)
        pool = ExecutorWalkPool(self.num_workers, kind=self.scan_with,
                                max_entries=self.max_walk_entries)
        with contextlib.closing(pool):
            return scan_source(src, imagefolder=imagefolder, include=include, exclude=exclude,
                               follow_symlinks=follow_symlinks, pool=pool,
                               class_folders=class_folders)

    def build(
        self, job: ShardJob, numbers: Sequence[int], target: PackTarget,
        progress: Progress | None,
    ) -> Generator[ShardOutcome, None, None]:
        """``shardpool.build_shards``; each finished shard is published to ``target``."""
        results = build_shards(job, numbers, num_workers=self.num_workers, progress=progress)
        with contextlib.closing(results):
            for result in results:
                if isinstance(result, ShardResult) and result.num_samples:
                    target.publish(result.name)  # a shard of only bad samples has no file
                yield result

    def close(self) -> None:
        """Nothing outlives a scan or a build."""
