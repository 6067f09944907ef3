"""Chains of resumes deliver exactly the uninterrupted sequence, through every loader a user takes.

A run is cut at 1-3 random points; each piece is a fresh dataset and loader
(as after a restart) that loads the state the previous piece saved. Through a
plain ``DataLoader`` (with ``StreamingDataset(batch_size=)``), torchdata's
``StatefulDataLoader`` and ``shardio.loader``, the batches of all pieces,
concatenated, must equal the batches of one uninterrupted epoch. Most examples
use 0 or 1 worker; a few use 2-3 (each worker is a process). Workers that take
whole batches arrange the epoch's windows in as many lanes as there are workers
(``shardio.order.plan.arrange_lanes``): the piece that reads first fixes them, and every
later piece, whatever its worker count, continues that arrangement.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardio import ShardWriter, WriteOptions
from shardio.errors import ResumeError
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import loader

NUM_SAMPLES = 301
SHUFFLE_BUFFER = 24
WORKERS = st.sampled_from([0, 0, 0, 1, 1, 1, 2, 3])


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chain") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=50)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:04d}", "n": i})
    return out


def indices(batch: Any) -> list[int]:
    if isinstance(batch, dict):
        return [int(i) for i in batch["__index__"]]
    return [int(i) for i in batch.indices]


def dataset(pack: Path, batch_size: int | None, lanes: int | None = None) -> StreamingDataset:
    return StreamingDataset(pack, decode="raw", shuffle_buffer=SHUFFLE_BUFFER, block_size=4,
                            batch_size=batch_size, lanes=lanes)


@cache
def uninterrupted(
    pack: Path, batch_size: int, workers: int = 0, lanes: int = 1
) -> list[list[int]]:
    """One epoch without interruption.

    By batches the order depends on the worker count only through its lanes, so
    one process reading with those lanes gives every path's sequence; a dataset
    without ``batch_size`` read by several workers gives each worker a contiguous
    part, ``workers`` then says how many.
    """
    ds = dataset(pack, batch_size, lanes) if lanes > 1 else dataset(pack, None)
    return [indices(b) for b in DataLoader(ds, batch_size=batch_size, num_workers=workers)]


Piece = Callable[[Any, int], tuple[list[list[int]], Any]]
"""One piece: load ``state`` (None: start), take up to ``take`` batches; the batches, the state."""


def plain_piece(pack: Path, batch_size: int, workers: int, by_batches: bool) -> Piece:
    def run(state: Any, take: int) -> tuple[list[list[int]], Any]:
        ds = dataset(pack, batch_size if by_batches else None)
        if state is not None:
            ds.load_state_dict(state)
        got: list[list[int]] = []
        for batch in DataLoader(ds, batch_size=batch_size, num_workers=workers) if take else ():
            got.append(indices(batch))
            if len(got) == take:
                break
        if workers == 0 and take % 2:  # without workers the main process knows its position
            return got, ds.state_dict()
        return got, ds.state_dict(num_batches=len(got), batch_size=batch_size,
                                  num_workers=workers)

    return run


def stateful_piece(pack: Path, batch_size: int, workers: int, by_batches: bool) -> Piece:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def run(state: Any, take: int) -> tuple[list[list[int]], Any]:
        ds = dataset(pack, batch_size if by_batches else None)
        dl = stateful.StatefulDataLoader(ds, batch_size=batch_size, num_workers=workers)
        if state is not None:
            dl.load_state_dict(state)
        got: list[list[int]] = []
        for batch in dl if take else ():
            got.append(indices(batch))  # a batch the loop received counts as delivered
            if len(got) == take:
                break
        return got, dl.state_dict()

    return run


def shardio_piece(pack: Path, batch_size: int, workers: int, by_batches: bool) -> Piece:
    def run(state: Any, take: int) -> tuple[list[list[int]], Any]:
        run_loader = loader(dataset(pack, None), batch_size=batch_size, num_workers=workers)
        if state is not None:
            run_loader.load_state_dict(state)
        got: list[list[int]] = []
        for batch in run_loader if take else ():
            got.append(indices(batch))
            if len(got) == take:
                break
        return got, run_loader.state_dict()

    return run


PATHS = {"plain": plain_piece, "stateful": stateful_piece, "shardio.loader": shardio_piece}


@pytest.mark.slow
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(sorted(PATHS)),
    batch_size=st.sampled_from([7, 10, 16]),
    by_batches=st.booleans(),
    workers=st.lists(WORKERS, min_size=2, max_size=4),
    cuts=st.lists(st.integers(0, 12), min_size=1, max_size=3),
)
def test_chains_of_resumes_deliver_the_uninterrupted_sequence(
    pack: Path, path: str, batch_size: int, by_batches: bool, workers: list[int], cuts: list[int]
) -> None:
    if path == "stateful":
        workers = [workers[0]] * len(workers)  # its worker states need the same worker count
    contiguous = path == "stateful" and not by_batches and workers[0] > 1
    takes = [*cuts, 10**6]
    first = next(n for n, take in enumerate(takes) if take)  # this piece's workers fix the lanes
    arranged = by_batches or path == "shardio.loader"
    lanes = max(1, workers[first % len(workers)]) if arranged else 1
    expected = uninterrupted(pack, batch_size, workers[0] if contiguous else 0, lanes)
    delivered: list[list[int]] = []
    state = None
    for n, take in enumerate(takes):
        if len(delivered) == len(expected):
            break  # the epoch is over (a piece ran to its end); the next would start another
        piece = PATHS[path](pack, batch_size, workers[n % len(workers)], by_batches)
        if path == "plain" and not by_batches and workers[n % len(workers)] > 1:
            # several workers, no batch_size on the dataset: the position is refused, not guessed
            with pytest.raises(ResumeError, match=r"batch_size=\d+\)"):
                piece(state, take)
            return
        got, state = piece(state, take)
        delivered += got
    assert delivered == expected


def test_second_resume_through_a_plain_dataloader_with_three_workers(pack: Path) -> None:
    """The issue's case: 301 samples, batch 10, 3 workers, resumed twice."""
    expected = uninterrupted(pack, 10, lanes=3)
    piece = plain_piece(pack, 10, 3, True)
    first, state = piece(None, 9)
    second, state = piece(state, 7)
    rest, _ = piece(state, len(expected))
    assert first + second + rest == expected
    assert len(expected) == 31 and all(len(b) == 10 for b in expected[:-1])
