"""The node cache's budget under jobs that share it, a removed folder, and small ranges on disk.

Independent jobs (separate processes, each sizing its read-ahead to the whole budget)
read through one cache folder: both finish, and a minimum a message states is one the
job really runs at. The cache folder is disposable: removed mid-epoch, it is made again
and the epoch completes exactly. The budget holds what the files occupy on disk (whole
filesystem blocks), not their sizes. Through moto, real processes and real files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from storage_servers import FAST_RETRY, S3Endpoint

import shardio
from shardio import CacheBudgetError, StreamingDataset
from shardio.storage import RangeCache, open_store
from shardio.storage.options import MIN_RANGE_BYTES, RemoteOptions

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

NUM, SHARD, BLOCK, RECORD = 1200, 300, 20, 1000
"""Records of ~1 KB in shards of 300, plan blocks of 20 (~21 KB ranges under a budget
below the dataset)."""
WORKERS = 2

JOB = r"""
import hashlib, json, sys
import torch
from shardio import StreamingDataset
from shardio.storage.options import RemoteOptions
url, cache, budget, seed, out = sys.argv[1:6]
remote = RemoteOptions(cache_dir=cache, max_cache_bytes=int(budget), range_bytes=64 << 10)
ds = StreamingDataset(url, decode="raw", shuffle_buffer=60, block_size=20, seed=int(seed),
                      remote=remote)
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
got = [(s["__key__"], hashlib.sha256(bytes(s["bin"])).hexdigest()) for s in loader]
with open(out, "w") as fh:
    json.dump(got, fh)
"""
"""One job: an epoch of a remote dataset read by 2 DataLoader workers; (key, digest) of each
sample written to a file."""

HOLD = r"""
import sys
from shardio.storage import RangeCache, open_store
url, cache, budget, size, count = sys.argv[1:6]
store = open_store(url)
cache = RangeCache(cache, max_cache_bytes=int(budget))
held = [cache.open_range(store, "blob", i * int(size), (i + 1) * int(size), version="v1")
        for i in range(int(count))]
print("held", flush=True)
sys.stdin.read()
"""
"""Another process holding ``count`` ranges of the object ``blob`` until its stdin closes."""


def _pack(out: Path, seed: int, *, num: int = NUM, record: int = RECORD) -> Path:
    rng = np.random.default_rng(seed)
    # several blocks a shard (the default bound would make each shard one block): the
    # ranges a budget must hold are then a block or a few, not a whole shard
    options = shardio.WriteOptions(codec="none", max_shard_samples=SHARD, block_records=125)
    with shardio.ShardWriter(out, options) as writer:
        for i in range(num):
            writer.write({"__key__": f"s{i:04d}", "bin": rng.bytes(record + i % 50)})
    return out


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("shared-cache")
    return [_pack(root / "a", 1), _pack(root / "b", 2)]


def _upload(folder: Path, url: str) -> str:
    store = open_store(url, retry=FAST_RETRY)
    for path in sorted(folder.iterdir()):
        store.put_file(path.name, path)
    return url


def _digests(samples: object) -> list[tuple[str, str]]:
    return [(s["__key__"], hashlib.sha256(bytes(s["bin"])).hexdigest())
            for s in samples]  # type: ignore[attr-defined]


def _expected(folder: Path) -> dict[str, str]:
    return dict(_digests(StreamingDataset(folder, decode="raw")))


def _check_exactly(got: list[tuple[str, str]], expected: dict[str, str]) -> None:
    assert Counter(key for key, _digest in got) == Counter(expected.keys())
    assert dict(got) == expected


def _loader(url: str, remote: RemoteOptions, *, workers: int = WORKERS,
            block_size: int = BLOCK) -> torch.utils.data.DataLoader[dict[str, object]]:
    ds = StreamingDataset(url, decode="raw", shuffle_buffer=60, block_size=block_size,
                          remote=remote)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)


def _true_minimum(url: str, tmp_path: Path) -> tuple[int, list[int]]:
    """The budget one job of 2 workers runs at, found by following what the errors state
    from a budget far too small; and the minimums they stated."""
    budget, stated = 1000, []
    for attempt in range(6):
        remote = RemoteOptions(cache_dir=tmp_path / f"probe{attempt}", max_cache_bytes=budget,
                               range_bytes=MIN_RANGE_BYTES, retry=FAST_RETRY)
        try:
            assert len(list(_loader(url, remote))) == NUM
        except CacheBudgetError as exc:
            found = re.findall(r"the minimum is (\d+) bytes", str(exc))
            assert found, str(exc)
            budget = int(found[-1])
            stated.append(budget)
        except RuntimeError as exc:  # a worker's error, re-raised by the DataLoader
            found = re.findall(r"CacheBudgetError: .* the minimum is (\d+) bytes", str(exc))
            assert found, str(exc)
            budget = int(found[-1])
            stated.append(budget)
        else:
            return budget, stated
    raise AssertionError(f"no budget the errors stated was enough: {stated}")


def _start(url: str, cache: Path, budget: int, seed: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", JOB, url, str(cache), str(budget), str(seed),
                             str(out)], stderr=subprocess.PIPE)


def _finish(job: subprocess.Popen[bytes], out: Path, expected: dict[str, str]) -> None:
    try:
        _stdout, stderr = job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()
        raise
    assert job.returncode == 0, stderr.decode(errors="replace")[-3000:]
    _check_exactly([tuple(pair) for pair in json.loads(out.read_text())], expected)


@pytest.mark.parametrize("same", [False, True], ids=["two-datasets", "one-dataset"])
def test_two_jobs_sharing_a_cache_at_four_times_the_minimum_both_finish(
        same: bool, datasets: list[Path], s3: S3Endpoint, tmp_path: Path) -> None:
    # each job sizes its read-ahead to the whole budget; holding it while waiting for the
    # other to release its own, both waited 2 minutes and failed saying a "minimum" above
    # the budget they shared
    urls = [_upload(folder, f"{s3.url}/{folder.name}") for folder in datasets]
    if same:
        urls, datasets = [urls[0]] * 2, [datasets[0]] * 2
    minimum, stated = _true_minimum(urls[0], tmp_path)
    assert stated == sorted(stated) and len(stated) <= 3, stated  # each a real lower bound
    cache = tmp_path / "cache"
    jobs = [_start(url, cache, 4 * minimum, seed, tmp_path / f"job{seed}.json")
            for seed, url in enumerate(urls)]
    for seed, (job, folder) in enumerate(zip(jobs, datasets, strict=True)):
        _finish(job, tmp_path / f"job{seed}.json", _expected(folder))


def test_a_budget_another_process_holds_fails_stating_only_true_minimums(
        s3: S3Endpoint, tmp_path: Path) -> None:
    size, count = 64 << 10, 4
    url = f"{s3.url}/blob-ds"
    store = open_store(url, retry=FAST_RETRY)
    data = os.urandom(size * (count + 1))
    store.put_bytes("blob", data)
    budget = count * size
    holder = subprocess.Popen([sys.executable, "-c", HOLD, url, str(tmp_path / "cache"),
                               str(budget), str(size), str(count)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        cache = RangeCache(tmp_path / "cache", max_cache_bytes=budget, wait_s=0.5)
        with pytest.raises(CacheBudgetError) as info:
            cache.open_range(store, "blob", count * size, (count + 1) * size, version="v1")
    finally:
        holder.communicate(b"", timeout=60)
    message = str(info.value)
    # the budget is a true minimum for this process (one range), and the others' holds are
    # named as theirs, not as a minimum of its own
    assert f"held {budget} bytes" in message, message
    assert all(int(n) <= budget for n in re.findall(r"minimum is (\d+)", message)), message
    assert re.search(rf"needs at least {size} bytes", message), message
    with cache.open_range(store, "blob", count * size, (count + 1) * size,
                          version="v1") as got:  # once they are released, it fits
        assert got.read() == data[count * size :]


@pytest.mark.parametrize("workers", [0, 2])
def test_removing_the_cache_folder_mid_epoch_the_epoch_completes_exactly(
        workers: int, datasets: list[Path], s3: S3Endpoint, tmp_path: Path) -> None:
    url = _upload(datasets[0], f"{s3.url}/a")
    cache = tmp_path / "cache"
    dataset_bytes = sum(p.stat().st_size for p in datasets[0].glob("*.rec"))
    remote = RemoteOptions(cache_dir=cache, max_cache_bytes=dataset_bytes // 2,
                           range_bytes=MIN_RANGE_BYTES, retry=FAST_RETRY)
    got: list[tuple[str, str]] = []
    existed, removed = [], 0
    for sample in _loader(url, remote, workers=workers):
        got.extend(_digests([sample]))
        if len(got) % 300 == 150:  # mid-shard, several times an epoch
            existed.append((cache / "ranges").is_dir())
            for _attempt in range(10):  # downloads may add files while it is removed
                shutil.rmtree(cache, ignore_errors=True)
                if not cache.exists():
                    removed += 1
                    break
    assert removed == 4
    assert existed == [True] * 4  # made again after each removal, and used
    _check_exactly(got, _expected(datasets[0]))


def _allocated_bytes(folder: Path) -> int:
    """What ``du`` says the cache folder's files occupy: their allocated blocks."""
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # evicted while we walk
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def test_the_budget_holds_the_disk_blocks_small_ranges_occupy(
        s3: S3Endpoint, tmp_path: Path) -> None:
    # records of ~500 bytes in blocks of 20: ranges of ~10 KB, each 12 KB on disk; counted
    # at their sizes, a full budget took 22% more on disk
    folder = _pack(tmp_path / "small", 7, num=1200, record=480)
    url = _upload(folder, f"{s3.url}/small")
    cache = tmp_path / "cache"
    dataset_bytes = sum(p.stat().st_size for p in folder.glob("*.rec"))
    budget = dataset_bytes // 2
    remote = RemoteOptions(cache_dir=cache, max_cache_bytes=budget,
                           range_bytes=MIN_RANGE_BYTES, retry=FAST_RETRY)
    high = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal high
        while not done.is_set():
            high = max(high, _allocated_bytes(cache))
            done.wait(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        got = _digests(_loader(url, remote, workers=0))
    finally:
        done.set()
        sampler.join()
    _check_exactly(got, _expected(folder))
    after = _allocated_bytes(cache)
    assert after > budget // 2  # the epoch filled the cache: the bound below is tested
    assert max(high, after) <= budget
    assert RangeCache(cache, max_cache_bytes=budget).usage().total_bytes >= after
