"""What the dask engine runs on the workers: walk tasks and shard builds.

Both are plain functions of their arguments, imported by the workers through
``shardio`` itself (which every worker must have installed). A task first
checks that its worker sees SRC (and a local OUT): a worker without the shared
mount would otherwise find every file unreadable. Tasks run with the cyclic GC
paused, as ``pack`` runs in its own process, and a build task reports the
files and bytes of its shard as Dask events (``PROGRESS_TOPIC``) for the
driver's progress bar. The driver side is ``shardio.packing.engines.dask``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

import distributed

from shardio.errors import PackError
from shardio.packing.build import ShardJob, ShardOutcome, ShardResult, build_shard
from shardio.packing.scan import WalkSpec, walk_task
from shardio.packing.stems import unpack_samples
from shardio.packing.walk import Folder
from shardio.storage import Store

REPORT_S: Final = 0.2
"""A task sends a progress event at most this often."""
PROGRESS_TOPIC: Final = "shardio-pack-progress"
"""Events ``{"run", "shard", "files", "bytes", "pid"}``: files and bytes of the shard so far."""

_gc_lock = threading.Lock()
_gc_holds = [0, False]
"""Tasks of this worker process running with the cyclic GC paused, and whether it was on."""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while a task runs, as ``pack`` does in its own process.

    A walk task makes a few objects per file, all of them kept: with the GC on,
    its collections rescanned them and a walk cost 10.7 µs per file instead of
    5.9 (measured). Counted, so that threads of one worker overlap safely.
    """
    with _gc_lock:
        if _gc_holds[0] == 0:
            _gc_holds[1] = gc.isenabled()
            gc.disable()
        _gc_holds[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holds[0] -= 1
            if _gc_holds[0] == 0 and _gc_holds[1]:
                gc.enable()


def _check_visible(what: str, folder: str | Path) -> None:
    """Refuse to go on where this worker does not see ``folder``.

    Otherwise every file would look unreadable, and ``--skip-bad`` would pack a
    dataset without them because of a missing mount.
    """
    if not os.path.isdir(folder):
        raise PackError(
            f"{folder}: {what} is not a folder on the Dask worker on {socket.gethostname()}; "
            "every worker must see SRC and a local OUT at the same path (a shared "
            "filesystem), or pack with --engine local", path=str(folder))


def walk_task_paused(spec: WalkSpec, folders: Sequence[Folder], max_entries: int | None) -> bytes:
    """``shardio.packing.scan.walk_task`` with the GC paused, where SRC is seen."""
    _check_visible("SRC", spec.root)
    with _gc_paused():
        return walk_task(spec, folders, max_entries)


class _TaskProgress:
    """Sends ``(files, bytes)`` of one shard being built as Dask events, at most every REPORT_S."""

    def __init__(self, run: str, number: int) -> None:
        self.worker = distributed.get_worker()
        self.run, self.number = run, number
        self.files = self.bytes = 0
        self.sent = 0.0

    def report(self, files: int, nbytes: int) -> None:
        self.files += files
        self.bytes += nbytes
        now = time.monotonic()
        if now - self.sent >= REPORT_S:
            self.sent = now
            self.worker.log_event(PROGRESS_TOPIC, {
                "run": self.run, "shard": self.number, "files": self.files,
                "bytes": self.bytes, "pid": os.getpid()})


def build_task(
    job: ShardJob, samples: bytes, number: int, store: Store | None, run: str,
    src: str | None = None,
) -> ShardOutcome:
    """A build task: shard ``number`` of ``job`` (cut down to it, its stream sent as
    ``stems.pack_samples``), put in place when complete; ``src``: SRC's absolute path."""
    if src is not None:
        _check_visible("SRC", src)
    if store is None:
        _check_visible("OUT", job.out)
    attempt = f"{run[:8]}-{uuid.uuid4().hex[:8]}"
    report = _TaskProgress(run, number).report
    with _gc_paused():
        job = replace(job, stream=unpack_samples(samples))
        if store is None:
            return build_shard(job, number, report, attempt=attempt)
        with tempfile.TemporaryDirectory(prefix="shardio-shard-") as staging:
            outcome = build_shard(replace(job, out=Path(staging)), number, report,
                                  attempt=attempt)
            if isinstance(outcome, ShardResult) and outcome.num_samples:
                store.put_file(outcome.name, Path(staging) / outcome.name)
            return outcome
