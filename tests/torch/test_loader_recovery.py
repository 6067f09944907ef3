"""``shardio.loader`` outlives a killed worker: the next ``iter()`` continues exactly.

A worker is SIGKILLed mid-epoch while the main process waits for its batch:
that iteration raises the DataLoader's error; the next ``iter()`` starts fresh
workers and delivers the rest of the epoch, so every sample arrives exactly
once. Killed between epochs, the dead worker is noticed before the next epoch
starts and replaced without an error.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from shardio import ShardWriter, WriteOptions
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import loader

pytestmark = pytest.mark.slow

NUM_SAMPLES = 120
BATCH = 8


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recovery") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=32)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:04d}", "n": i})
    return out


class Gate:
    """A transform run in the workers: sample ``at`` waits for the file ``open`` to exist.

    The worker that reaches it first writes its pid to ``blocked``, so the
    test knows whom to kill while the main process waits for that batch.
    """

    def __init__(self, at: int, folder: Path) -> None:
        self.at, self.folder = at, folder

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__index__"] == self.at:
            if not (self.folder / "open").exists():
                (self.folder / "blocked").write_text(str(os.getpid()))
            while not (self.folder / "open").exists():
                time.sleep(0.01)
        return sample


def reference(pack: Path, epochs: int) -> list[list[list[int]]]:
    """Batches of each epoch read in one process, uninterrupted, in the lanes of 2 workers."""
    ds = StreamingDataset(pack, decode="raw", shuffle_buffer=32, batch_size=BATCH, lanes=2)
    out = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        out.append([b["__index__"].tolist() for b in DataLoader(ds, batch_size=BATCH)])
    return out


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_killed_worker_mid_epoch_then_next_iter_continues_exactly(
    pack: Path, tmp_path: Path
) -> None:
    expected = reference(pack, 2)
    gated = 5  # batch 5 (worker 1's third) waits at its first sample until the gate opens
    ds = StreamingDataset(pack, decode="raw", shuffle_buffer=32,
                          transform=Gate(expected[0][gated][0], tmp_path))
    run = loader(ds, batch_size=BATCH, num_workers=2)
    batches = iter(run)
    delivered = [next(batches)["__index__"].tolist() for _ in range(gated)]
    killed: list[int] = []

    def kill_the_blocked_worker() -> None:
        wait_for(tmp_path / "blocked")
        killed.append(int((tmp_path / "blocked").read_text()))
        time.sleep(0.2)  # the main thread is waiting inside the DataLoader by now
        os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_blocked_worker)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid"):
        killer.start()
        next(batches)  # batch 5 never comes: its worker is killed while we wait
    killer.join()
    assert killed and not alive(killed[0])
    (tmp_path / "open").touch()

    rest = [b["__index__"].tolist() for b in run]  # fresh workers, the same epoch
    assert delivered + rest == expected[0]
    assert sorted(i for b in delivered + rest for i in b) == list(range(NUM_SAMPLES))
    assert [b["__index__"].tolist() for b in run] == expected[1]  # then the next epoch
    assert run.epoch == 1


class PidLog:
    """A transform that notes, in ``folder``, the pid of every worker that reads a sample."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        (self.folder / str(os.getpid())).touch()
        return sample


def test_worker_killed_between_epochs_is_replaced(pack: Path, tmp_path: Path) -> None:
    expected = reference(pack, 2)
    ds = StreamingDataset(pack, decode="raw", shuffle_buffer=32, transform=PidLog(tmp_path))
    run = loader(ds, batch_size=BATCH, num_workers=2)
    assert [b["__index__"].tolist() for b in run] == expected[0]
    workers = {int(p.name) for p in tmp_path.iterdir()}
    assert len(workers) == 2 and workers <= {p.pid for p in multiprocessing.active_children()}
    pid = min(workers)
    # the DataLoader's SIGCHLD handler raises in whatever the main thread runs then
    with pytest.raises(RuntimeError, match=rf"DataLoader worker \(pid {pid}\)"):
        os.kill(pid, signal.SIGKILL)
        for _ in range(500):
            time.sleep(0.01)
    for log in tmp_path.iterdir():
        log.unlink()
    assert [b["__index__"].tolist() for b in run] == expected[1]  # no error, nothing lost
    replaced = {int(p.name) for p in tmp_path.iterdir()}
    assert len(replaced) == 2 and pid not in replaced


@pytest.mark.parametrize("persistent", [True, False])
def test_an_epoch_left_early_ends_and_the_next_iter_starts_the_next(
        pack: Path, persistent: bool) -> None:
    # without persistent workers, the workers the loop's end shut down were taken for
    # killed ones, and the next iter() continued the epoch left (from its second epoch on)
    run = loader(StreamingDataset(pack, decode="raw", seed=2), batch_size=BATCH, num_workers=2,
                 persistent_workers=persistent)
    epochs = []
    for stop in (None, 1, None, 1, None):
        seen = []
        for count, batch in enumerate(run, 1):
            seen += batch.indices.tolist()
            if count == stop:
                break
        epochs.append((run.epoch, len(seen) if stop else sorted(seen)))
    full = list(range(NUM_SAMPLES))
    assert epochs == [(0, full), (1, BATCH), (2, full), (3, BATCH), (4, full)]
