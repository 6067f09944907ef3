"""The local engine: walk tasks and shard builds in processes forked on this machine.

The walk (``shardio.scan``) runs in a pool of ``num_workers`` forked processes,
started only when the tree is larger than what one task walks; each task's
part comes back through a pipe. Shards are built by ``shardio.shardpool``'s
workers, forked after planning so that they inherit the job. With one worker
everything runs in this process. Threads instead of processes for the walk
(``scan_with="threads"``) were measured slower: ``scandir`` and ``lstat``
release the GIL, but the per-entry Python work between them does not
(``benchmarks/bench_pack.py --scan-only``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
from collections.abc import Generator, Sequence
from typing import Literal

from shardio.packtarget import PackTarget
from shardio.scan import MAX_ENTRIES, WalkSpec, walk_part
from shardio.shardbuild import ShardJob, ShardOutcome, ShardResult
from shardio.shardpool import Progress, build_shards, default_workers
from shardio.source import Source, scan_source
from shardio.walk import Folder, WalkPart


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
        self._running: set[cf.Future[WalkPart]] = set()

    def submit(self, spec: WalkSpec, folders: list[Folder]) -> None:
        """Start a walk of ``folders`` (and the pool, the first time)."""
        if self._executor is None:
            if self.kind == "threads":
                self._executor = cf.ThreadPoolExecutor(self.slots, "shardio-walk")
            else:
                method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
                self._executor = cf.ProcessPoolExecutor(
                    self.slots, multiprocessing.get_context(method), _ignore_sigint)
        self._running.add(self._executor.submit(walk_part, spec, folders, self.max_entries))

    def next_done(self) -> WalkPart:
        """The part of a finished walk task; re-raises its error."""
        done, _ = cf.wait(self._running, return_when=cf.FIRST_COMPLETED)
        future = done.pop()
        self._running.discard(future)
        return future.result()

    def close(self) -> None:
        """Stop the pool: tasks not started are dropped, running ones are waited for."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


class LocalEngine:
    """Walk and build on this machine with ``num_workers`` processes (default: every core)."""

    name = "local"

    def __init__(self, num_workers: int | None = None, *,
                 scan_with: Literal["processes", "threads"] = "processes",
                 max_walk_entries: int = MAX_ENTRIES) -> None:
        self.num_workers = num_workers or default_workers()
        self.scan_with = scan_with
        self.max_walk_entries = max_walk_entries

    def scan(
        self, src: str | os.PathLike[str], *, imagefolder: bool | None, include: Sequence[str],
        exclude: Sequence[str], follow_symlinks: bool,
    ) -> Source:
        """``scan_source`` with the walk split over the worker processes."""
        if self.num_workers <= 1:
            return scan_source(src, imagefolder=imagefolder, include=include, exclude=exclude,
                               follow_symlinks=follow_symlinks)
        pool = ExecutorWalkPool(self.num_workers, kind=self.scan_with,
                                max_entries=self.max_walk_entries)
        with contextlib.closing(pool):
            return scan_source(src, imagefolder=imagefolder, include=include, exclude=exclude,
                               follow_symlinks=follow_symlinks, pool=pool)

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
