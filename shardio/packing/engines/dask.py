"""The dask engine: SRC walked and shards built as tasks on a Dask cluster.

This process (the *driver*) stays the only one that plans and journals: it
walks the first part of SRC itself, hands the folders left over to walk tasks
(``shardio.packing.scan``), plans the shards from what they found exactly as a local
pack does, then submits one build task per shard, each sent only its own
samples (``ShardJob.for_shard``), keeping a few per worker thread in flight.
A task builds its shard under a temporary name of its own attempt and renames
it when complete (``build_shard(attempt=...)``), or, for a URL output, builds
it in the worker's temporary folder and uploads it (one atomic PUT); a task
that Dask retries after its worker died, or that runs twice, therefore only
puts the same bytes under the same name again. The driver journals shards as
they come back and writes the manifest last, so ``--resume`` after a killed
driver works as after a killed local pack.

Paths: SRC is walked at its absolute path, a local OUT is written at its
absolute path, and sample paths relative to this process's working folder are
opened relative to it on the workers (``ShardJob.base``), so messages name
files exactly as a local pack does. All of them must be on a filesystem every
worker sees at the same path. Progress comes from the tasks as Dask events
(``PROGRESS_TOPIC``). The tasks themselves are ``shardio.packing.engines.dasktasks``.
Imported only when engine ``dask`` is used.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import uuid
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Any, Final

import dask.config
import distributed
from distributed.comm.addressing import get_address_host_port, parse_address

from shardio.errors import PackError
from shardio.packing.build import ShardJob, ShardOutcome
from shardio.packing.engines.dasktasks import PROGRESS_TOPIC, build_task, walk_task_paused
from shardio.packing.pool import Progress, default_workers
from shardio.packing.scan import ScanPart, WalkSpec
from shardio.packing.sources.files import PackSource, scan_source
from shardio.packing.stems import pack_samples
from shardio.packing.target import PackTarget
from shardio.packing.walk import Folder

MAX_ENTRIES: Final = 16384
"""Entries per walk task: a task costs the scheduler about a millisecond, so larger than local."""
TASKS_PER_THREAD: Final = 2
"""Build tasks in flight per worker thread: one running, one queued behind it."""
CONNECT_S: Final = 10.0
"""How long the driver tries to reach a scheduler given by address: a running one answers in
milliseconds, and dask's default of 30 s only delays the error."""
POLL_S: Final = 0.2
"""How often the driver refreshes the progress bar while it waits for shards."""
WORKER_ENV: Final = {"MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
"""Environment of the workers of ``local_cluster``: dask sets glibc's trim threshold to
64 KB so that workers hand memory back at once; a build task frees and takes back
buffers the size of its files, and its workers spent twice the system time of this
process building the same shard (measured on the JPEGs). Set it so on your own cluster
(``distributed.nanny.pre-spawn-environ``) for the same effect."""
_PATHS = attrgetter("paths")
_NUM_BYTES = attrgetter("num_bytes")


def local_cluster(num_workers: int) -> distributed.LocalCluster:
    """A cluster on this machine: ``num_workers`` single-threaded processes on 127.0.0.1.

    One thread per process: packing is CPU-bound Python, so threads would share one
    GIL. No dashboard (no port to take), and ``WORKER_ENV``.
    """
    # glibc reads it when a process starts: dask sets these before it spawns each worker
    settings = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in WORKER_ENV.items()}
    with dask.config.set(settings):
        return distributed.LocalCluster(
            n_workers=num_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=None, silence_logs=logging.WARNING)


def connect(scheduler: str) -> distributed.Client:
    """A client of the scheduler at address ``scheduler``; a ``PackError`` with the fix if none.

    A malformed address is refused before any connection, and a TCP address nothing listens
    on at once: dask itself retries a refused connection until its timeout.
    """
    try:
        scheme, _ = parse_address(scheduler)
        host, port = get_address_host_port(scheduler)
        if scheme in ("tcp", "tls"):
            socket.create_connection((host, port), timeout=CONNECT_S).close()
        return distributed.Client(scheduler, timeout=CONNECT_S, set_as_default=False)
    except (OSError, ValueError) as exc:  # TimeoutError is an OSError
        raise PackError(
            f"cannot use the Dask scheduler at {scheduler!r} ({exc}); give the address of a "
            "running scheduler as `dask scheduler` prints it, e.g. tcp://host:8786, or leave "
            "--scheduler out for a local cluster", path=scheduler) from exc


def _slots(client: distributed.Client) -> int:
    threads: dict[str, int] = client.nthreads()
    return max(1, sum(threads.values()))


class _Completions:
    """Futures in the order they finish, through their done callbacks.

    ``distributed.wait`` needs the client made current, and ``Client.as_current``
    sets a dask config each time: 8 ms a call, measured, for every shard.
    """

    def __init__(self) -> None:
        self.done: queue.SimpleQueue[distributed.Future] = queue.SimpleQueue()

    def watch(self, future: distributed.Future) -> distributed.Future:
        """Report ``future`` when it finishes (result, error or cancellation)."""
        future.add_done_callback(self.done.put)
        return future

    def next(self, timeout: float | None = None) -> distributed.Future | None:
        """A finished future, or None after ``timeout`` seconds."""
        try:
            return self.done.get(timeout=timeout)
        except queue.Empty:
            return None


class DaskWalkPool:
    """A ``WalkPool`` whose tasks run on the cluster."""

    def __init__(self, client: distributed.Client, max_entries: int) -> None:
        self.client = client
        self.slots = _slots(client)
        self.max_entries = max_entries
        self._running: set[distributed.Future] = set()
        self._completions = _Completions()

    def submit(self, spec: WalkSpec, folders: list[Folder]) -> None:
        """Start a walk task."""
        self._running.add(self._completions.watch(self.client.submit(
            walk_task_paused, spec, folders, self.max_entries,
            key=f"shardio-walk-{uuid.uuid4().hex}")))

    def next_done(self) -> ScanPart:
        """The part of a finished walk task; re-raises its error."""
        future = self._completions.next()
        assert future is not None
        self._running.discard(future)
        return ScanPart.from_bytes(future.result())

    def close(self) -> None:
        """Cancel the walks still running (after an error)."""
        if self._running:
            self.client.cancel(list(self._running))
            self._running.clear()


class _DriverProgress:
    """The files and bytes of this run: finished shards exactly, shards in flight from events."""

    def __init__(self, job: ShardJob, run: str) -> None:
        self.job, self.run = job, run
        self.lock = threading.Lock()
        self.partial: dict[int, tuple[int, int]] = {}
        self.files = self.bytes = 0

    def event(self, event: tuple[float, dict[str, Any]]) -> None:
        """A task's event (called on the client's event loop thread)."""
        msg = event[1]
        if msg.get("run") == self.run:
            with self.lock:
                old = self.partial.get(msg["shard"], (0, 0))
                self.partial[msg["shard"]] = max(old, (msg["files"], msg["bytes"]))

    def finished(self, number: int) -> None:
        """Shard ``number`` is done: count it whole."""
        span = self.job.plan[number]
        samples = self.job.stream[span.start - self.job.offset:span.stop - self.job.offset]
        files = sum(map(len, map(_PATHS, samples)))
        nbytes = sum(map(_NUM_BYTES, samples))
        with self.lock:
            self.partial.pop(number, None)
            self.files += files
            self.bytes += nbytes

    def totals(self) -> tuple[int, int]:
        """``(files, bytes)`` handled so far."""
        with self.lock:
            return (self.files + sum(f for f, _ in self.partial.values()),
                    self.bytes + sum(b for _, b in self.partial.values()))


def _remove_attempts(out: Path, run: str) -> None:
    """Remove temporary files of this run's attempts whose workers died mid-shard."""
    mark = f"-{run[:8]}-"
    for name in os.listdir(out):
        if name.startswith(".shard-") and mark in name and name.endswith(".tmp"):
            (out / name).unlink(missing_ok=True)


class DaskEngine:
    """Walk and build on a Dask cluster: at ``scheduler``, or a local one of ``num_workers``."""

    name = "dask"

    def __init__(self, *, num_workers: int | None = None, scheduler: str | None = None) -> None:
        self.cluster: distributed.LocalCluster | None = None
        self.src: str | None = None
        """SRC's absolute path once scanned: build tasks check that their worker sees it."""
        if scheduler is None:
            self.cluster = local_cluster(num_workers or default_workers())
            self.client = distributed.Client(self.cluster, set_as_default=False)
        else:
            self.client = connect(scheduler)

    def scan(
        self, src: str | os.PathLike[str], *, imagefolder: bool | None, include: Sequence[str],
        exclude: Sequence[str], follow_symlinks: bool, class_folders: bool = False,
    ) -> PackSource:
        """``scan_source`` with the walk in cluster tasks, at SRC's absolute path."""
        pool = DaskWalkPool(self.client, MAX_ENTRIES)
        self.src = os.path.abspath(src)
        try:
            return scan_source(src, imagefolder=imagefolder, include=include, exclude=exclude,
                               follow_symlinks=follow_symlinks, pool=pool, walk_root=self.src,
                               class_folders=class_folders)
        finally:
            pool.close()

    def build(
        self, job: ShardJob, numbers: Sequence[int], target: PackTarget,
        progress: Progress | None,
    ) -> Generator[ShardOutcome, None, None]:
        """Build tasks for ``numbers``; yield each outcome once its shard is in ``target``."""
        store = target.store
        relative = bool(job.stream) and not os.path.isabs(job.stream[0].paths[0])
        job = replace(job, out=job.out.absolute(), base=os.getcwd() if relative else None)
        run = uuid.uuid4().hex
        tracker = _DriverProgress(job, run)
        if progress is not None:
            self.client.subscribe_topic(PROGRESS_TOPIC, tracker.event)
        todo = deque(numbers)
        running: dict[distributed.Future, int] = {}
        completions = _Completions()
        try:
            while todo or running:
                window = TASKS_PER_THREAD * _slots(self.client)
                while todo and len(running) < window:
                    number = todo.popleft()
                    piece = job.for_shard(number)
                    running[completions.watch(self.client.submit(
                        build_task, replace(piece, stream=()), pack_samples(piece.stream),
                        number, store, run, self.src, key=f"shardio-shard-{number:05d}-{run}",
                        retries=0))] = number
                future = completions.next(POLL_S)
                if future is not None:
                    number = running.pop(future)
                    outcome: ShardOutcome = _result(future, number, job)
                    if progress is not None:
                        tracker.finished(number)
                    yield outcome
                if progress is not None:
                    progress(*tracker.totals())
        finally:
            if running:
                self.client.cancel(list(running))
            if progress is not None:
                self.client.unsubscribe_topic(PROGRESS_TOPIC)
            if store is None:
                _remove_attempts(job.out, run)

    def close(self) -> None:
        """Close the client, and the local cluster if this engine started one."""
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _result(future: distributed.Future, number: int, job: ShardJob) -> Any:
    """The task's outcome; a shard whose workers kept dying becomes a PackError."""
    try:
        return future.result()
    except distributed.KilledWorker as exc:
        raise PackError(
            f"{job.out}: the workers building shard {number} died, again after Dask retried it "
            f"on others ({exc}); run the same command with --resume to finish",
            path=str(job.out)) from exc
