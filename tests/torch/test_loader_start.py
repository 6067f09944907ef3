"""Where a ``shardio.loader`` epoch starts (``ShardLoader._start_position``).

A fresh epoch starts at 0 without the main process planning the epoch's order
(``StreamingDataset.start_state``) before its workers are asked for batches; a
loaded resume still starts where it stopped. Through real loaders, with 0 and 2
workers: the batches of fresh epochs and of resumes, against uninterrupted runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardio import ShardWriter, WriteOptions
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import ShardLoader, loader

NUM_SAMPLES = 157  # a short last batch


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("start") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=30)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:04d}", "bin": bytes([i % 251]) * (50 + i)})
    return out


def make(pack: Path, workers: int) -> ShardLoader:
    return loader(StreamingDataset(pack, decode="raw", seed=3, shuffle_buffer=40),
                  batch_size=8, num_workers=workers)


def indices(batches: Any) -> list[list[int]]:
    return [batch.indices.tolist() for batch in batches]


def counting(run: ShardLoader, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the loader's ``start_state`` calls in this process."""
    calls: list[int] = []
    original = run.dataset.start_state

    def start_state() -> dict[str, Any]:
        calls.append(1)
        return original()

    monkeypatch.setattr(run.dataset, "start_state", start_state)
    return calls


def test_planning_imports_numpy_random_with_the_module() -> None:
    # forked workers inherit it instead of each importing it on their first plan
    code = ("import sys, numpy; lazy = 'numpy.random' not in sys.modules; "
            "import shardio.order.plan; print(lazy, 'numpy.random' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[1] == "True"


@pytest.mark.parametrize("workers", [0, 2])
def test_fresh_epochs_start_at_zero_without_planning_here(
        pack: Path, workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make(pack, workers)
    calls = counting(run, monkeypatch)
    epochs = [indices(run) for _ in range(3)]
    assert calls == []
    for batches in epochs:
        assert sorted(i for b in batches for i in b) == list(range(NUM_SAMPLES))
    assert epochs[0] != epochs[1]  # the epochs advanced
    # the same batches as a loader that chose each epoch with set_epoch
    other = make(pack, workers)
    for epoch, batches in enumerate(epochs):
        other.dataset.set_epoch(epoch)
        assert indices(other) == batches


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loaded_resume_starts_where_it_stopped(pack: Path, workers: int) -> None:
    whole = make(pack, workers)
    first = indices(whole)
    second = indices(whole)
    run = make(pack, workers)
    taken = []
    for batch in run:
        taken.append(batch.indices.tolist())
        if len(taken) == 5:
            break
    state = run.state_dict()
    resumed = make(pack, workers)
    resumed.load_state_dict(state)
    assert taken + indices(resumed) == first
    assert indices(resumed) == second  # the next epoch starts fresh, at 0
