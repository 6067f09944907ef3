"""Resumable state without torch: the state-dict format, merging ranks, what a reader reads next.

A ``state_dict`` is plain msgpack/JSON-friendly data (``rank_state``):
``{"shardio": 1, "seed", "order", "epoch", "world_size", "num_workers",
"consumed": {rank: [samples per worker]}, "prior"}`` (and ``"lanes", "batch"``
when the epoch's windows were arranged in lanes), where ``order`` holds the
settings besides the seed that fix an epoch's order (``order_settings``) and
``prior`` is the state an epoch was itself resumed from under another split
(see ``shardio.order.plan``). A rank whose workers take its order in whole batches
records one count: its position in that order. A DataLoader worker's own state
(``StatefulDataLoader``) is ``{"epoch", "split", "position", "base"}``.

``plan_stage`` goes the other way: from the epoch and pending resume shared
with the workers, and a worker's own state, to the samples that (rank, worker)
reads next. Everything here is a function of its arguments; it must not
import torch (the torch side is ``shardio.torch.state`` and ``shardio.torch.dataset``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardio.errors import ResumeError
from shardio.order.mix import MixConfig
from shardio.order.plan import (
    IndexArray,
    PlanConfig,
    Progress,
    Split,
    interleave_batches,
    same_split,
    samples_per_rank,
    stage_order,
)


def order_settings(config: PlanConfig) -> dict[str, Any]:
    """What besides the seed and epoch fixes the order: two states must agree on it.

    A mixture adds its sources' sizes and counts per epoch (lists, as they
    come back from msgpack or JSON).
    """
    settings: dict[str, Any] = {
        "num_samples": config.num_samples,
        "shuffle": config.shuffle,
        "block_size": config.block_size,
        "window": config.window,
        "drop_last": config.drop_last,
    }
    if config.head:  # orders planned without one record none, and stay comparable
        settings["head"] = config.head
    if isinstance(config, MixConfig):
        settings["mix"] = {"sizes": list(config.source_sizes), "counts": list(config.counts)}
    return settings


def progress_to_state(progress: Progress) -> dict[str, Any]:
    """A ``Progress`` as plain msgpack/JSON-friendly data.

    Lanes are written only when there are several, so a state of a plain
    shuffle reads the same to a shardio from before lanes.
    """
    state: dict[str, Any] = {
        "epoch": progress.epoch,
        "world_size": progress.world_size,
        "num_workers": progress.num_workers,
        "consumed": {str(r): list(c) for r, c in progress.consumed.items()},
        "prior": None if progress.prior is None else progress_to_state(progress.prior),
    }
    if progress.lanes > 1:
        state["lanes"], state["batch"] = progress.lanes, progress.batch
    return state


def progress_from_state(state: Mapping[str, Any], config: PlanConfig | None = None, *,
                        where: str = "the state") -> Progress:
    """Inverse of ``progress_to_state``; with ``config``, each rank's counts are also bounded
    by what a rank yields of ``config`` in an epoch.

    Raises:
        ResumeError: ``state`` is not one ``state_dict()`` wrote: a field missing or of
            another type, a negative count or one past the epoch (``where`` names it).
    """
    try:
        progress = _progress(state)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResumeError(f"{where} is not one shardio's state_dict() wrote "
                          f"({type(exc).__name__}: {exc}); resume from one that was") from exc
    at: Progress | None = progress
    while config is not None and at is not None:
        most = samples_per_rank(config.num_samples, at.world_size, config.drop_last)
        for rank, counts in at.consumed.items():
            if sum(counts) > most:
                raise ResumeError(
                    f"{where} counts {sum(counts)} samples consumed on rank {rank}, where a "
                    f"rank of {at.world_size} yields {most} an epoch: it was saved for "
                    "another dataset; resume from this dataset's state_dict()")
        at = at.prior
    return progress


def _progress(state: Mapping[str, Any]) -> Progress:
    prior = state.get("prior")
    return Progress(
        epoch=int(state["epoch"]),
        world_size=int(state["world_size"]),
        num_workers=int(state["num_workers"]),
        consumed={int(r): tuple(int(x) for x in c) for r, c in state["consumed"].items()},
        prior=None if prior is None else _progress(prior),
        lanes=int(state.get("lanes", 1)),
        batch=int(state.get("batch", 1)),
    )


def rank_state(
    config: PlanConfig,
    resume: Mapping[str, Any] | None,
    *,
    epoch: int,
    split: Split,
    consumed: Sequence[int],
) -> dict[str, Any]:
    """The state of ``split.rank`` after its ``split.num_workers`` workers consumed ``consumed``.

    ``consumed[k]`` counts from the start of worker ``k``'s order in this epoch
    (samples skipped by an exact resume included); ``resume`` is the state this
    epoch was resumed from, if any; ``split.lanes`` and ``split.batch`` are the
    stage's (``Stage.split``).
    """
    prior = None
    if resume is not None:
        progress = progress_from_state(resume)
        if progress.epoch == epoch:
            exact = same_split(progress, split) and split.rank in progress.consumed
            prior = progress.prior if exact else progress
    progress = Progress(
        epoch=epoch,
        world_size=split.world_size,
        num_workers=split.num_workers,
        consumed={split.rank: tuple(int(c) for c in consumed)},
        prior=prior,
        lanes=split.lanes,
        batch=split.batch,
    )
    return {
        "shardio": 1,
        "seed": config.seed,
        "order": order_settings(config),
        **progress_to_state(progress),
    }


@dataclass(frozen=True)
class Stage:
    """What one (rank, worker) reads of the current epoch, and where it starts.

    ``order`` is this worker's part of the epoch (of a resumed epoch: of the
    stage planned after the resume point); ``skip`` of its samples were already
    consumed. By batches, ``order`` holds this worker's batches of the rank's
    order from rank position ``offset`` on, ``count`` positions long in all.
    """

    epoch: int
    generation: int
    order: IndexArray
    skip: int
    offset: int
    count: int
    base: dict[str, Any] | None
    """The resume state this stage was planned from (None: a fresh epoch)."""
    split: Split
    """The split whose order the positions count in: by batches the rank's, with its lanes."""


def plan_stage(
    config: PlanConfig,
    batch_size: int | None,
    shared: Mapping[str, Any],
    local: Mapping[str, Any] | None,
    split: Split,
    lanes: int | None = None,
) -> Stage:
    """What ``split`` reads next.

    Args:
        config: the dataset's order.
        batch_size: workers take the rank's order in whole batches of this many
            in turn; None: each worker takes a contiguous part.
        shared: ``{"epoch", "resume", "generation"}`` as the main process set it.
        local: this worker's own saved state (``StatefulDataLoader``), if any;
            it applies when its epoch and split are the current ones.
        split: the rank and worker reading.
        lanes: by batches, the lanes a fresh or re-split order is arranged in
            (``shardio.order.plan.arrange_lanes``); None: ``split.num_workers``. An
            exact resume keeps the lanes of the state it resumes.
    """
    epoch, base = int(shared["epoch"]), shared.get("resume")
    here = [split.rank, split.world_size, split.worker, split.num_workers]
    own = local is not None and local.get("epoch") == epoch and local.get("split") == here
    if own and local is not None and "base" in local:
        base = local["base"]  # a worker's position counts within the stage it read
    unit, start, prior = _stage_start(config, batch_size, epoch, base, split, lanes)
    full = stage_order(config, epoch, unit, prior)
    if batch_size is not None:
        order = interleave_batches(full[start:], batch_size, split.worker, split.num_workers)
        skip, offset = 0, start
    else:
        order, skip, offset = full, start, 0
    if own and local is not None:
        skip = int(local["position"])
    base_state = None if base is None else dict(base)
    return Stage(epoch, int(shared["generation"]), order, skip, offset, len(full), base_state,
                 unit)


def _stage_start(
    config: PlanConfig, batch_size: int | None, epoch: int, base: Mapping[str, Any] | None,
    split: Split, lanes: int | None,
) -> tuple[Split, int, Progress | None]:
    """The split whose order a stage reads, the position it starts at, and the progress it
    re-plans after (``plan_stage``'s arguments)."""
    unit = split
    if batch_size is not None:
        ways = lanes or split.num_workers
        ways = ways if config.shuffle and ways > 1 else 1
        unit = Split(split.rank, split.world_size, lanes=ways, batch=batch_size if ways > 1 else 1)
    if base is None or int(base["epoch"]) != epoch:
        return unit, 0, None
    progress = progress_from_state(base)
    if not (same_split(progress, unit) and split.rank in progress.consumed):
        return unit, 0, progress
    start = progress.consumed[split.rank][unit.worker]
    if start == 0 and progress.prior is None:
        return unit, 0, None  # nothing read yet: a fresh epoch, in this reader's lanes
    return progress.split(split.rank, unit.worker), start, progress.prior


def stage_split(
    config: PlanConfig,
    batch_size: int | None,
    shared: Mapping[str, Any],
    split: Split,
    lanes: int | None = None,
) -> Split:
    """The split (with its lanes) whose order ``split`` reads in the current epoch.

    What a rank's state records, so that its resume is arranged as the epoch it
    continues was; cheap, since the order itself is not planned.
    """
    unit, _start, _prior = _stage_start(
        config, batch_size, int(shared["epoch"]), shared.get("resume"), split, lanes)
    return unit


def position_after_batches(
    stage: Stage,
    num_batches: int,
    *,
    loader_batch_size: int | None,
    dataset_batch_size: int | None,
    workers: int,
    path: str,
) -> int:
    """The rank's position after a plain DataLoader delivered ``num_batches`` of ``stage``.

    Exact when workers take whole batches in turn (``dataset_batch_size``) or
    there was at most one worker: then the DataLoader delivered the rank's
    order itself, whatever happened before this stage.

    Raises:
        ResumeError: the position cannot be known (several workers that each
            took a contiguous part), or the batch sizes disagree or are missing.
    """
    size = dataset_batch_size
    if size is not None and loader_batch_size not in (None, size):
        raise ResumeError(
            f"{path}: batch_size={loader_batch_size} but the dataset splits work in batches "
            f"of {size}: give the DataLoader and StreamingDataset the same batch_size"
        )
    size = size or loader_batch_size
    if size is None:
        raise ResumeError(f"{path}: pass batch_size= (the DataLoader's) with num_batches")
    if dataset_batch_size is None and workers > 1:
        raise ResumeError(
            f"{path}: a plain DataLoader with {workers} workers takes their batches in turn "
            "and restarts at worker 0 when resumed, so num_batches cannot fix each worker's "
            f"position: build the dataset with StreamingDataset(..., batch_size={size}) "
            "(workers then take whole batches in turn and any resume is exact), or use "
            "shardio.loader or torchdata's StatefulDataLoader"
        )
    return min(stage.offset + stage.skip + num_batches * size, stage.count)


def check_same_order(
    state: Mapping[str, Any], seed: int, order: Mapping[str, Any], *, against: str = "this dataset"
) -> None:
    """Refuse ``state`` unless it was saved with this ``seed`` and ``order_settings``.

    Raises:
        ResumeError: names every setting that differs, what the state holds and
            what ``against`` (the dataset, or the first state) has.
    """
    if not isinstance(state, Mapping) or not isinstance(state.get("order") or {}, Mapping):
        raise ResumeError(f"a state whose {'order' if isinstance(state, Mapping) else 'top'} "
                          "is not a mapping is not one shardio's state_dict() wrote; resume "
                          "from one that was")
    saved = {"seed": state.get("seed", seed), **(state.get("order") or {})}
    # a state from before the order was recorded holds only its seed: that is all we can check
    wanted = {"seed": seed, **(order if "order" in state else {})}
    differ = [name for name, value in wanted.items() if saved.get(name) != value]
    if differ:
        raise ResumeError(
            "state was saved with "
            + ", ".join(f"{name}={saved.get(name)!r}" for name in differ)
            + f"; {against} has "
            + ", ".join(f"{name}={wanted[name]!r}" for name in differ)
            + ": the resumed order would not match. Open the dataset with the seed and "
            "settings (shuffle, shuffle_buffer, block_size, drop_last; a mixture's sources, "
            "weights and epoch_size) the state was saved with"
        )


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the per-rank ``state_dict()`` of every rank, to resume under another world size.

    Raises:
        ResumeError: the states disagree on seed, order settings, epoch, world
            size, worker count or the state their epoch was resumed from, or
            give one rank two different positions.
    """
    if not states:
        raise ResumeError("no states to merge: pass the state_dict() of every rank")
    first = states[0]
    merged = dict(first)
    consumed: dict[str, list[int]] = {}
    lanes: tuple[int, tuple[int, int]] | None = None
    """(a state that read something, its lanes and batch)"""
    for n, state in enumerate(states):
        if ("order" in state) != ("order" in first):
            raise ResumeError(f"cannot merge: only one of states 0 and {n} records its order")
        check_same_order(state, int(first.get("seed", 0)), first.get("order") or {},
                         against="state 0")
        for name in ("epoch", "world_size", "num_workers", "prior"):
            if state.get(name) != first.get(name):
                raise ResumeError(
                    f"cannot merge: state {n} has {name}={state.get(name)!r}, state 0 has "
                    f"{first.get(name)!r}; merge the states every rank saved at the same step "
                    "of the same run"
                )
        for rank, counts in state["consumed"].items():
            if consumed.get(rank, counts) != counts:
                raise ResumeError(
                    f"cannot merge: rank {rank} appears twice with positions "
                    f"{consumed[rank]} and {counts}"
                )
            consumed[rank] = list(counts)
        # lanes arrange only what a rank read: a rank at its start may have planned other ones
        if any(int(c) for counts in state["consumed"].values() for c in counts):
            arranged = (state.get("lanes", 1), state.get("batch", 1))
            if lanes is not None and arranged != lanes[1]:
                raise ResumeError(
                    f"cannot merge: state {n} read an order arranged in lanes, batch "
                    f"{arranged}, state {lanes[0]} in {lanes[1]}; the ranks of one run read with "
                    "different numbers of DataLoader workers: give every rank the same num_workers"
                )
            lanes = (n, arranged)
    merged.pop("lanes", None)
    merged.pop("batch", None)
    if lanes is not None and lanes[1][0] > 1:
        merged["lanes"], merged["batch"] = lanes[1]
    merged["consumed"] = consumed
    return merged
