"""Per-step data wait and per-stage times of a loader, as a plain dict with stable names.

``LoaderStats`` is what ``shardio.loader`` and ``DevicePrefetcher`` keep: for each batch
handed to the training loop, the seconds the loop waited for it (from asking for the next
batch to getting it) and the seconds the batch spent in each stage that made it. Its
``as_dict()`` names follow torchtitan's ``data_wait_s`` / ``data_wait_pct``. Always on:
a few ``perf_counter`` calls and appends per *batch*, never per sample
(``benchmarks/bench_telemetry.py`` measures it against ``ENABLED = False``). Imports
nothing of shardio and no torch, so any layer may use it.
"""

from __future__ import annotations

import itertools
import logging
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ENABLED = True
"""False: the loaders take no times (``benchmarks/bench_telemetry.py`` measures the cost)."""

WORKER_STAGES = ("read", "decode", "collate", "handover")
"""Where a batch's time goes before it reaches the loop: ``read`` (fetch, check and
inflate the records), ``decode`` (images and crops, and the transforms: one stretch of
the worker's work, which ``shardio.doctor`` splits by timing a few samples with and
without them), ``collate`` (building the batch), ``handover`` (into the worker's shared
memory). Seconds of the process that made the batch: with workers they run in
parallel, so their sum can exceed the wall time."""

DEVICE_STAGES = ("h2d", "device_decode")
"""``DevicePrefetcher``'s part: the copy to the device (on CUDA the copy itself, timed by
CUDA events; else the blocking copy) and the host time of ``decode=``."""

Clock = Callable[[], float]

shard_opens = 0
"""Shard files this process has opened (``DatasetReader``): the loader hands each batch
the opens since the last (``shard_opens`` in ``stats()``), so ``shardio.doctor`` can
say how many files a sample costs. A process-wide count: readers iterated side by side
in one process share it."""


def count_shard_open() -> None:
    """One more shard file opened by this process."""
    global shard_opens
    shard_opens += 1


def _no_clock() -> float:
    return 0.0


def clock() -> Clock:
    """``time.perf_counter``, or a clock that reads 0 when telemetry is off."""
    return time.perf_counter if ENABLED else _no_clock


def default_log(stats: Mapping[str, Any]) -> None:
    """Log one line of ``stats`` on the ``shardio`` logger (INFO)."""
    logging.getLogger("shardio").info(
        "data wait %.1f%% (%.3f s over %d steps; p50 %.1f ms, p99 %.1f ms)",
        stats["data_wait_pct"], stats["data_wait_s"], stats["steps"],
        1e3 * stats["data_wait_p50_s"], 1e3 * stats["data_wait_p99_s"])


FOLD_STEPS = 1024
"""Steps kept as the loaders hand them over (a list append each) before they are folded
into compact arrays (8 bytes a figure): ``array.extend`` of a tuple costs several times
an append, and a long run must not hold a tuple per step."""


class LoaderStats:
    """The steps since the last ``reset()``: wait per step, stage seconds per step."""

    def __init__(self, stages: Sequence[str], *, counts: Sequence[str] = (),
                 log_every: int | None = None,
                 log_fn: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Args:
        stages: the stage names this loader times.
        counts: names of counts per step that follow the stage seconds in ``record``'s
            ``times`` (``shard_opens``), reported summed under their own name.
        log_every: every this many steps, hand the stats of those steps to ``log_fn``.
        log_fn: receives ``as_dict()`` of the last ``log_every`` steps (default: one
            INFO line on the ``shardio`` logger).
        """
        if log_every is not None and (not isinstance(log_every, int) or log_every < 1):
            raise ValueError(f"log_every must be a whole number of steps, 1 or more; "
                             f"got {log_every!r}")
        self.stages = tuple(stages)
        self.counts = tuple(counts)
        self._columns = (*self.stages, *self.counts)
        self.log_every = log_every
        self.log_fn = log_fn or default_log
        self.reset()

    def reset(self) -> None:
        """Forget every step recorded."""
        self._wait = array("d")
        self._flat = array("d")
        """Every folded step's ``times``, ``len(_columns)`` figures a step."""
        self._new_wait: list[float] = []
        self._new_times: list[Sequence[float]] = []
        self.busy_s = 0.0
        self._handed_at: float | None = None
        self._logged = 0
        self._busy_logged = 0.0
        self._due = self._next_due()

    @property
    def steps(self) -> int:
        """Steps recorded since the last ``reset()``."""
        return len(self._wait) + len(self._new_wait)

    @property
    def wait(self) -> array[float]:
        """The loop's wait per step, in seconds."""
        self._fold()
        return self._wait

    def _next_due(self) -> int:
        """Pending steps at which ``record`` next folds (and maybe logs)."""
        due = FOLD_STEPS
        if self.log_every is not None:
            due = min(due, self._logged + self.log_every - len(self._wait))
        return max(1, due)

    def start(self) -> None:
        """A new iteration: the time until its first ask is not the loop's step."""
        self._handed_at = None

    def record(self, asked: float, handed: float, times: Sequence[float] = ()) -> None:
        """One batch handed over: asked for at ``asked``, handed at ``handed``;
        ``times``: its seconds per stage, in ``stages`` order, then its ``counts``
        (missing ones count 0). Kept as given (``times`` must not change after), so the
        loop's path is two appends: the rest waits for ``FOLD_STEPS`` steps or a reader."""
        if self._handed_at is not None:
            self.busy_s += asked - self._handed_at
        self._handed_at = handed
        self._new_wait.append(handed - asked)
        self._new_times.append(times)
        if len(self._new_wait) >= self._due:
            self._fold()
            if self.log_every is not None and len(self._wait) - self._logged >= self.log_every:
                self.log_fn(self.as_dict(self._logged, self._busy_logged))
                self._logged, self._busy_logged = len(self._wait), self.busy_s
            self._due = self._next_due()

    def _fold(self) -> None:
        """Move the steps recorded since the last fold into the arrays."""
        if not self._new_wait:
            return
        width = len(self._columns)
        self._wait.fromlist(self._new_wait)
        flat = list(itertools.chain.from_iterable(self._new_times))
        if len(flat) != width * len(self._new_times):  # some steps short (or long)
            flat = [x for times in self._new_times
                    for x in (*times[:width], *[0.0] * (width - len(times)))]
        self._flat.fromlist(flat)
        self._new_wait.clear()
        self._new_times.clear()
        self._due = self._next_due()

    def column(self, name: str, since: int = 0) -> array[float]:
        """Stage or count ``name`` per step, from step ``since`` on."""
        self._fold()
        width = len(self._columns)
        return self._flat[since * width + self._columns.index(name)::width]

    def add_stage(self, name: str, seconds: float, back: int = 1) -> None:
        """Add ``seconds`` to stage ``name`` of the ``back``-th latest step (a time known late)."""
        self._fold()
        width = len(self._columns)
        if len(self._wait) >= back >= 1:
            self._flat[(len(self._wait) - back) * width + self._columns.index(name)] += seconds

    def as_dict(self, since: int = 0, busy_before: float = 0.0) -> dict[str, Any]:
        """The stats of the steps from ``since`` on: a plain dict, every name stable.

        ``steps``; ``data_wait_s`` (seconds the loop waited for batches) and
        ``data_wait_pct`` (of the loop's time: waits plus the time between handing a
        batch over and asking for the next); ``data_wait_{p50,p90,p99,max}_s`` per step;
        ``step_s`` (the loop's time); ``first_batch_s``; ``<stage>_s`` per stage; each
        count summed under its name.
        ``busy_before``: the loop's time outside waits before step ``since``.
        """
        self._fold()
        wait = self._wait[since:]
        waited = sum(wait)
        busy = max(0.0, self.busy_s - busy_before)
        order = sorted(wait)

        def quantile(q: float) -> float:
            return order[min(len(order) - 1, int(q * len(order)))] if order else 0.0

        out: dict[str, Any] = {
            "steps": len(wait),
            "data_wait_s": waited,
            "data_wait_pct": 100.0 * waited / (waited + busy) if waited + busy > 0 else 0.0,
            "data_wait_p50_s": quantile(0.5),
            "data_wait_p90_s": quantile(0.9),
            "data_wait_p99_s": quantile(0.99),
            "data_wait_max_s": order[-1] if order else 0.0,
            "step_s": waited + busy,
            "first_batch_s": self._wait[0] if self._wait else 0.0,
        }
        for name in self.stages:
            out[f"{name}_s"] = sum(self.column(name, since))
        for name in self.counts:
            out[name] = round(sum(self.column(name, since)))
        return out

    def series(self) -> dict[str, list[float]]:
        """Per step: ``wait``, each stage's seconds and each count (``shardio.doctor``)."""
        out = {"wait": list(self.wait)}
        out.update({name: list(self.column(name)) for name in self._columns})
        return out
