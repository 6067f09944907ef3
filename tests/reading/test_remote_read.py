"""Remote datasets read end to end: S3 (moto) behind the fault proxy, and a read-only HTTP server.

A generated ImageFolder of JPEGs is packed locally (both backends), the
dataset folder is uploaded with the store's ``put_file``, and every reader
goes through the proxy: verify, the stream with 0 and 2 workers (every sample
once, bytes equal to the source files), random access, an exact mid-epoch
resume, a cache budget smaller than the dataset (its folder, sampled, never
above it), a budget below what is in flight, each range once per node, fork /
spawn / forkserver workers, and the CLI with ``AWS_ENDPOINT_URL`` only.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from storage_servers import FAST_RETRY, HttpEndpoint, S3Endpoint

import shardio
from shardio import (
    CacheBudgetError,
    IndexedDataset,
    ManifestNotFoundError,
    StreamingDataset,
)
from shardio.backends.remoterecords import RemoteRecordsReader, tail_guess
from shardio.cli import main
from shardio.storage import open_store
from shardio.storage.options import MIN_RANGE_BYTES, RemoteOptions
from shardio.synth import make_imagefolder

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

RANGE = MIN_RANGE_BYTES
"""64 KiB ranges: a shard of ~600 KB is cut into ~10, so read-ahead and eviction happen."""
FAULTS = {"cut_every": 6, "slowdown_every": 9, "seed": 3}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 120 JPEGs of 5–20 KB."""
    root = tmp_path_factory.mktemp("remote-src")
    make_imagefolder(root, num_classes=4, per_class=30, seed=5, long_side=(160, 240))
    return root


@pytest.fixture(scope="module", params=["records", "lmdb"])
def packed(request: pytest.FixtureRequest, source: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``source`` packed locally in shards of 40 samples."""
    out = tmp_path_factory.mktemp(f"remote-{request.param}") / "ds"
    # stored blocks of 4 images (~60 KB): a range of RANGE holds whole blocks
    shardio.pack(source, out, options=shardio.WriteOptions(backend=request.param,
                                                           max_shard_samples=40, block_records=4))
    return out


def upload(folder: Path, url: str) -> str:
    """Put every file of ``folder`` under ``url`` (the pack-to-remote path is tested elsewhere)."""
    store = open_store(url, retry=FAST_RETRY)
    for path in sorted(folder.iterdir()):
        store.put_file(path.name, path)
    return url


def options(tmp_path: Path, **overrides: Any) -> RemoteOptions:
    settings: dict[str, Any] = {"cache_dir": tmp_path / "cache", "max_cache_bytes": 64 << 20,
                                "range_bytes": RANGE, "retry": FAST_RETRY}
    settings.update(overrides)
    return RemoteOptions(**settings)


def check_exactly_once(samples: list[dict[str, Any]], source: Path) -> None:
    keys = Counter(s["__key__"] for s in samples)
    assert len(keys) == len(samples) == 120 and set(keys.values()) == {1}
    for sample in samples:
        assert bytes(sample["image"]) == (source / sample["__key__"]).read_bytes()


def stream(ds: StreamingDataset, num_workers: int, **kwargs: Any) -> list[dict[str, Any]]:
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers, **kwargs)
    return [dict(s, image=bytes(s["image"])) for s in loader]


def test_verify_stream_and_random_access_through_faults(
        packed: Path, source: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    url = upload(packed, s3.url)
    s3.plan.reset(**FAULTS)
    opts = options(tmp_path)
    report = shardio.verify(url, remote=opts)
    assert report.ok and report.num_records == 120, report.faults
    ds = StreamingDataset(url, decode="raw", shuffle_buffer=32, remote=opts)
    check_exactly_once(stream(ds, 0), source)
    check_exactly_once(stream(ds, 2), source)
    indexed = IndexedDataset(url, decode="raw", remote=opts)
    for i in random.Random(0).sample(range(120), 25):
        sample = indexed[i]
        assert bytes(sample["image"]) == (source / sample["__key__"]).read_bytes()
    indexed.close()
    assert s3.plan.cuts + s3.plan.slowdowns > 0  # the faults really happened


def test_resume_mid_epoch_is_exact(packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    url = upload(packed, s3.url)
    s3.plan.reset(**FAULTS)

    def make() -> Any:
        ds = StreamingDataset(url, decode="raw", shuffle_buffer=32, remote=options(tmp_path))
        return shardio.loader(ds, batch_size=8, num_workers=2)

    full = [b.indices.tolist() for b in make()]
    interrupted = make()
    for k, _batch in enumerate(interrupted):
        if k == 5:
            break
    state = interrupted.state_dict()
    del interrupted
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.indices.tolist() for b in resumed] == full[6:]


def _folder_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # evicted while we walk
                total += os.path.getsize(os.path.join(dirpath, name))
    return total


def _cache_high_water(url: str, opts: RemoteOptions, source: Path, cache: Path) -> int:
    """The largest the cache folder got (sampled every 2 ms) over an epoch read by 2
    workers, which must deliver every sample exactly once."""
    high = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal high
        while not done.is_set():
            high = max(high, _folder_bytes(cache))
            done.wait(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        ds = StreamingDataset(url, decode="raw", shuffle_buffer=24, remote=opts)
        check_exactly_once(stream(ds, 2), source)
    finally:
        done.set()
        sampler.join()
    return high


def _uploaded_rec(packed: Path, s3: S3Endpoint, budget: int) -> str:
    """``packed`` uploaded, if it is a ``.rec`` dataset larger than ``budget``."""
    if packed.joinpath("shard-00000.mdb").exists():
        pytest.skip("LMDB shards are cached whole: the budget must hold every shard in use")
    assert budget < sum(p.stat().st_size for p in packed.glob("*.rec"))
    return upload(packed, s3.url)


def test_a_budget_smaller_than_the_dataset_holds_and_the_epoch_completes(
        source: Path, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    budget = 3 * (2 + 1) * (RANGE + (24 << 10))  # 3 processes x (2 ahead + 1), a range + a record
    url = _uploaded_rec(packed, s3, budget)
    s3.plan.reset(**FAULTS)
    opts = options(tmp_path, max_cache_bytes=budget, max_in_flight=2)
    assert 0 < _cache_high_water(url, opts, source, tmp_path / "cache") <= budget


def test_random_reads_under_a_budget_pin_no_evicted_range(
        source: Path, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    # the reader's block cache keeps blocks decoded: a block kept as a view of a node-cache
    # range would hold the range's file (mapped, unlinked) past its eviction, beyond the
    # budget; kept blocks are private copies, and the folder stays within the budget
    budget = 3 * (RANGE + (24 << 10))
    url = _uploaded_rec(packed, s3, budget)
    indexed = IndexedDataset(url, decode="raw", remote=options(tmp_path, max_cache_bytes=budget,
                                                                max_in_flight=1))
    order = list(range(120))
    random.Random(1).shuffle(order)
    for i in order:
        sample = indexed[i]
        assert bytes(sample["image"]) == (source / sample["__key__"]).read_bytes()
        assert _folder_bytes(tmp_path / "cache") <= budget
    kept = indexed._reader._blocks._blocks.values()
    assert kept and all(not isinstance(column.data.obj, mmap.mmap)
                        for block in kept for *_, column in block.columns
                        if column.data is not None)
    indexed.close()


def test_read_ahead_shrinks_to_fit_a_budget_below_its_default_limits(
        source: Path, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    # the defaults keep up to 16 ranges (32 MiB) ahead per process: 2 workers x 17 ranges of
    # ~88 KB need 3 MB; a budget for 3 ranges a process is enough, with fewer ahead
    if packed.joinpath("shard-00000.mdb").exists():
        pytest.skip("LMDB shards are cached whole")
    url = upload(packed, s3.url)
    budget = 2 * 3 * (RANGE + (24 << 10))
    opts = options(tmp_path, max_cache_bytes=budget)
    assert opts.max_in_flight * RANGE > budget
    assert 0 < _cache_high_water(url, opts, source, tmp_path / "cache") <= budget


@pytest.mark.parametrize("workers", [0, 2])
def test_under_half_a_budget_a_shuffled_epoch_downloads_each_range_once(
        workers: int, source: Path, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    # ranges are whole plan blocks, each wanted by one shuffle window: none is evicted
    # between two uses (ranges cut across blocks were fetched again, 4.6x the dataset);
    # with 2 workers, each reads its part of a block as one run, in the same window
    if packed.joinpath("shard-00000.mdb").exists():
        pytest.skip("LMDB shards are cached whole")
    url = upload(packed, s3.url)
    manifest = shardio.read_manifest(packed)
    dataset_bytes = sum(s.num_bytes for s in manifest.shards)
    tails = sum(tail_guess(s.num_bytes, s.num_samples, manifest.block_records)
                for s in manifest.shards)
    opts = options(tmp_path, max_cache_bytes=dataset_bytes // 2, max_in_flight=2)
    ds = StreamingDataset(url, decode="raw", shuffle_buffer=24, block_size=4, remote=opts)
    s3.plan.reset()
    check_exactly_once(stream(ds, workers), source)
    assert 0 < s3.plan.body_bytes <= dataset_bytes + tails


def test_a_budget_below_what_is_in_flight_fails_at_once_saying_the_minimum(
        packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    url = upload(packed, s3.url)
    ds = StreamingDataset(url, decode="raw", remote=options(tmp_path, max_cache_bytes=100_000))
    with pytest.raises(CacheBudgetError, match=r"max_cache_bytes=100000 .* the minimum is \d+"):
        next(iter(ds))


def test_each_range_is_downloaded_once_per_node_with_two_workers(
        packed: Path, source: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    url = upload(packed, s3.url)
    opts = options(tmp_path)
    ds = StreamingDataset(url, decode="raw", shuffle_buffer=32, remote=opts)
    s3.plan.reset()
    check_exactly_once(stream(ds, 2), source)
    entries = list((tmp_path / "cache" / "ranges").iterdir())
    # each cache entry (a range, a tail, or an LMDB file) came from exactly one GET: none twice
    assert s3.plan.ranged_gets == len(entries) >= 3
    s3.plan.reset()
    check_exactly_once(stream(ds, 2), source)  # a second epoch reads the node cache only
    assert s3.plan.ranged_gets == 0


def _looking_ahead(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], list[int]]:
    """Spy on remote runs: whether each run the stream looked ahead at was cached (and
    so handed to the checker thread and decoded by field), and the runs read through the
    read-ahead queue instead (``read_run``). A core is declared free for the checker."""
    monkeypatch.setattr(shardio.torch.dataset, "available_cpus", lambda: 4)
    looked: list[bool] = []
    read: list[int] = []
    cached_runs, read_run = RemoteRecordsReader.cached_runs, RemoteRecordsReader.read_run

    def spy_cached(self: RemoteRecordsReader, runs: Any) -> Any:
        got = cached_runs(self, runs)
        looked.extend(run is not None for run in got)
        return got

    def spy_read(self: RemoteRecordsReader, start: int, stop: int) -> Any:
        read.append(start)
        return read_run(self, start, stop)

    monkeypatch.setattr(RemoteRecordsReader, "cached_runs", spy_cached)
    monkeypatch.setattr(RemoteRecordsReader, "read_run", spy_read)
    return looked, read


def _first_epoch(packed: Path, source: Path, s3: S3Endpoint, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch,
                 ) -> tuple[StreamingDataset, list[bool], list[int]]:
    """A ``.rec`` dataset on S3 read once through the look-ahead spies (``_looking_ahead``),
    so its ranges are in the node cache; the dataset and the spies' lists, emptied."""
    if shardio.read_manifest(packed).backend != "records":
        pytest.skip("LMDB shards are cached whole and read by their local reader")
    url = upload(packed, s3.url)
    # 64 KiB ranges: most runs lie in a range that starts mid-shard, not at its byte 0
    ds = StreamingDataset(url, decode="raw", shuffle_buffer=32, remote=options(tmp_path))
    looked, read = _looking_ahead(monkeypatch)
    check_exactly_once(stream(ds, 0), source)
    assert read, "epoch 1: the ranges come as the runs are read"
    looked.clear()
    read.clear()
    return ds, looked, read


def test_a_cached_epoch_is_checked_ahead_and_decoded_by_field(
        packed: Path, source: Path, s3: S3Endpoint, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ds, looked, read = _first_epoch(packed, source, s3, tmp_path, monkeypatch)
    s3.plan.reset()
    check_exactly_once(stream(ds, 0), source)
    assert s3.plan.ranged_gets == 0
    assert looked and all(looked), "every run of a cached epoch was looked ahead at"
    assert not read, "and none was read through the read-ahead queue"


def test_a_cached_range_damaged_on_disk_is_fetched_again_when_looked_ahead_at(
        packed: Path, source: Path, s3: S3Endpoint, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ds, looked, _read = _first_epoch(packed, source, s3, tmp_path, monkeypatch)
    # the first range of a shard (``...@0-<stop>``): its header and records, not a tail
    damaged = next(p for p in sorted((tmp_path / "cache" / "ranges").iterdir())
                   if "@0-" in p.name)
    good = damaged.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x10  # inside a JPEG payload: the frame still parses
    damaged.write_bytes(bytes(data))
    s3.plan.reset()
    check_exactly_once(stream(ds, 0), source)  # the cache's copy is no fault of the shard's
    assert s3.plan.ranged_gets == 1 and damaged.read_bytes() == good  # it was fetched again
    assert looked and not all(looked), "the damaged range was not read from a look-ahead view"


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_dataset_used_in_the_parent_streams_in_workers(
        method: str, source: Path, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    if method != "fork" and packed.joinpath("shard-00000.mdb").exists():
        pytest.skip("one backend is enough for spawn and forkserver (they pickle the dataset)")
    url = upload(packed, s3.url)
    s3.plan.reset(**FAULTS)
    # A forkserver child has the environment of the forkserver process, which Python starts
    # once, maybe before this test's AWS_* settings: explicit options travel with the dataset.
    explicit = {"endpoint_url": s3.proxy.url, "key": "testing", "secret": "testing"}
    remote = options(tmp_path, storage_options=explicit if method == "forkserver" else None)
    ds = StreamingDataset(url, decode="raw", shuffle_buffer=32, remote=remote)
    used = iter(ds)
    try:
        first = [next(used) for _ in range(3)]  # the parent's client, threads and ranges are live
        assert len({s["__key__"] for s in first}) == 3
        check_exactly_once(stream(ds, 2, multiprocessing_context=method), source)
    finally:
        used.close()  # type: ignore[attr-defined]


def test_a_dataset_served_over_http_range_streams(
        packed: Path, source: Path, http: HttpEndpoint, tmp_path: Path) -> None:
    shutil.copytree(packed, http.root / "ds")
    http.plan.reset(cut_every=5, seed=1)
    ds = StreamingDataset(f"{http.url}/ds", decode="raw", shuffle_buffer=32,
                          remote=options(tmp_path))
    check_exactly_once(stream(ds, 0), source)
    assert http.plan.ranged_gets > 0 and http.plan.cuts > 0


def test_a_missing_manifest_names_the_url(s3: S3Endpoint, tmp_path: Path) -> None:
    with pytest.raises(ManifestNotFoundError, match=f"{s3.url}/nothing/manifest.json: no "):
        shardio.read_manifest(f"{s3.url}/nothing", remote=options(tmp_path))


def test_cli_reads_s3_urls_with_the_endpoint_from_the_environment(
        packed: Path, source: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    url = upload(packed, s3.url)
    cache = ["--cache-dir", str(tmp_path / "cache"), "--max-cache-bytes", "64MB"]
    runner = CliRunner()
    result = runner.invoke(main, ["info", url])
    assert result.exit_code == 0 and "samples      120" in result.output, result.output
    result = runner.invoke(main, ["verify", url, *cache])
    assert result.exit_code == 0 and result.output.rstrip().endswith("OK"), result.output
    result = runner.invoke(main, ["ls", url, *cache])
    assert result.exit_code == 0 and len(result.output.splitlines()) == 1 + 120, result.output
    key = "class_02/" + sorted(p.name for p in (source / "class_02").iterdir())[3]
    result = runner.invoke(main, ["cat", url, key, *cache])
    assert result.exit_code == 0 and result.stdout_bytes == (source / key).read_bytes()
    result = runner.invoke(main, ["unpack", url, str(tmp_path / "restored"), *cache])
    assert result.exit_code == 0, result.output
    restored = sorted(p.relative_to(tmp_path / "restored") for p in
                      (tmp_path / "restored").rglob("*") if p.is_file())
    assert restored == sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    result = runner.invoke(main, ["verify", f"{s3.url}/nothing", *cache])
    assert result.exit_code == 1 and f"{s3.url}/nothing/manifest.json" in result.output


@pytest.mark.parametrize("long_keys", [False, True])
def test_a_v3_tail_is_one_get_of_about_its_size_and_two_where_keys_are_longer(
        long_keys: bool, s3: S3Endpoint, tmp_path: Path) -> None:
    """A v3 shard's first tail GET is sized from the manifest's ``block_records`` and 24 key
    bytes a record, not the 64 of format v2 (whose excess is bytes of the last blocks,
    downloaded again with their range). Keys longer than that take a second GET; every
    sample still arrives once with its bytes."""
    rng = random.Random(5)
    out = tmp_path / "ds"
    payloads = {}
    with shardio.ShardWriter(out, shardio.WriteOptions(max_shard_samples=3000,
                                                       block_records=100)) as writer:
        for i in range(6000):
            tag = "".join(rng.choice("0123456789abcdef") for _ in range(60)) if long_keys else ""
            key = f"c{i % 10}/s{i:05d}{tag}"
            payloads[key] = rng.randbytes(rng.randrange(20, 200))
            writer.write({"__key__": key, "bin": payloads[key]})
    url = upload(out, f"{s3.url}/{int(long_keys)}")
    manifest = shardio.read_manifest(out)
    tails = []
    for info in manifest.shards:
        with open(out / info.name, "rb") as fh:
            fh.seek(info.num_bytes - 48)
            tails.append(info.num_bytes - int.from_bytes(fh.read(8), "little"))
    guesses = [tail_guess(s.num_bytes, s.num_samples, manifest.block_records)
               for s in manifest.shards]
    v2_rule = [tail_guess(s.num_bytes, s.num_samples) for s in manifest.shards]
    assert all(g < v for g, v in zip(guesses, v2_rule, strict=True))
    assert all((t <= g) != long_keys for t, g in zip(tails, guesses, strict=True))
    s3.plan.reset()
    with shardio.DatasetReader(url, remote=options(tmp_path)) as reader:
        for number in range(len(manifest.shards)):
            reader.shard(number)
    assert s3.plan.ranged_gets == (2 if long_keys else 1) * len(manifest.shards)
    assert s3.plan.body_bytes == sum(guesses) + (sum(tails) if long_keys else 0)
    ds = StreamingDataset(url, decode="raw", remote=options(tmp_path))
    got = {s["__key__"]: bytes(s["bin"]) for s in ds}
    assert got == payloads
