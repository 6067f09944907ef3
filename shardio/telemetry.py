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

import logging
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ENABLED = True
"""False: the loaders take no times (``benchmarks/bench_telemetry.py`` measures the cost)."""

WORKER_STAGES = ("read", "decode", "collate", "handover")
"""Where a batch's time goes before it reaches the loop: ``read`` (fetch, check and
inflate the records), ``decode`` (images and transforms), ``collate`` (building the
batch), ``handover`` (into the worker's shared memory). Seconds of the process that made
the batch: with workers they run in parallel, so their sum can exceed the wall time."""

DEVICE_STAGES = ("h2d", "device_decode")
"""``DevicePrefetcher``'s part: the copy to the device (on CUDA the copy itself, timed by
CUDA events; else the blocking copy) and the host time of ``decode=``."""

Clock = Callable[[], float]


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


class LoaderStats:
    """The steps since the last ``reset()``: wait per step, stage seconds per step."""

    def __init__(self, stages: Sequence[str], *, log_every: int | None = None,
                 log_fn: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Args:
        stages: the stage names this loader times.
        log_every: every this many steps, hand the stats of those steps to ``log_fn``.
        log_fn: receives ``as_dict()`` of the last ``log_every`` steps (default: one
            INFO line on the ``shardio`` logger).
        """
        if log_every is not None and (not isinstance(log_every, int) or log_every < 1):
            raise ValueError(f"log_every must be a whole number of steps, 1 or more; "
                             f"got {log_every!r}")
        self.stages = tuple(stages)
        self.log_every = log_every
        self.log_fn = log_fn or default_log
        self.reset()

    def reset(self) -> None:
        """Forget every step recorded."""
        self.wait = array("d")
        self.stage = {name: array("d") for name in self.stages}
        self.busy_s = 0.0
        self.first_batch_s: float | None = None
        self._handed_at: float | None = None
        self._logged = 0
        self._busy_logged = 0.0

    def start(self) -> None:
        """A new iteration: the time until its first ask is not the loop's step."""
        self._handed_at = None

    def record(self, asked: float, handed: float, times: Sequence[float] = ()) -> None:
        """One batch handed over: asked for at ``asked``, handed at ``handed``;
        ``times``: its seconds per stage, in ``stages`` order (missing ones count 0)."""
        if self._handed_at is not None:
            self.busy_s += asked - self._handed_at
        self._handed_at = handed
        self.wait.append(handed - asked)
        if self.first_batch_s is None:
            self.first_batch_s = handed - asked
        for i, name in enumerate(self.stages):
            self.stage[name].append(times[i] if i < len(times) else 0.0)
        if self.log_every is not None and len(self.wait) - self._logged >= self.log_every:
            self.log_fn(self.as_dict(self._logged, self._busy_logged))
            self._logged, self._busy_logged = len(self.wait), self.busy_s

    def add_stage(self, name: str, seconds: float, back: int = 1) -> None:
        """Add ``seconds`` to stage ``name`` of the ``back``-th latest step (a time known late)."""
        column = self.stage[name]
        if len(column) >= back:
            column[-back] += seconds

    def as_dict(self, since: int = 0, busy_before: float = 0.0) -> dict[str, Any]:
        """The stats of the steps from ``since`` on: a plain dict, every name stable.

        ``steps``; ``data_wait_s`` (seconds the loop waited for batches) and
        ``data_wait_pct`` (of the loop's time: waits plus the time between handing a
        batch over and asking for the next); ``data_wait_{p50,p90,p99,max}_s`` per step;
        ``step_s`` (the loop's time); ``first_batch_s``; ``<stage>_s`` per stage.
        ``busy_before``: the loop's time outside waits before step ``since``.
        """
        wait = self.wait[since:]
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
            "first_batch_s": self.first_batch_s or 0.0,
        }
        for name in self.stages:
            out[f"{name}_s"] = sum(self.stage[name][since:])
        return out

    def series(self) -> dict[str, list[float]]:
        """Per step: ``wait`` and each stage's seconds (for ``shardio.doctor``'s plot)."""
        out = {"wait": list(self.wait)}
        out.update({name: list(column) for name, column in self.stage.items()})
        return out
