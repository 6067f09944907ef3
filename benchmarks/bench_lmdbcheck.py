"""Question: what does the LMDB structure check cost per shard open (warm, cold) and per epoch?

``shardio.backends.lmdbcheck.check_lmdb_file`` runs on every open of an LMDB shard
(issue 7): it reads the meta pages, every branch and leaf page and the header of
every overflow run. This packs the shared ImageFolder (``benchmarks/datagen.py``,
2,000 JPEGs by default) with ``backend="lmdb"`` and measures, in rounds:

* the check alone on every shard with the file in the page cache (warm) and after
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the file (cold), per shard;
* a cold epoch: every shard evicted, then every sample read in stored order through
  ``DatasetReader`` (LMDB read, CRC-32, msgpack; no JPEG decode, the cheapest epoch
  there is), once as shipped and once with the check replaced by a no-op, the two
  orders alternating from round to round;
* one warm ``StreamingDataset`` epoch (raw samples) and, for images, one warm epoch
  that also decodes every JPEG with Pillow, the least work a training epoch does.

``--kind tiny`` measures 1-4 KB files instead, whose values sit inline in leaf pages,
so the check reads every page of the file. Writes ``benchmarks/results/lmdbcheck-KIND.json``.

    python -m benchmarks.bench_lmdbcheck [--kind images|tiny] [--files 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import shardio.backends.lmdb as lmdb_backend
from benchmarks.datagen import ensure_tree
from shardio.backends.lmdbcheck import check_lmdb_file
from shardio.manifest import read_manifest
from shardio.pack import pack
from shardio.reader import DatasetReader
from shardio.writer import WriteOptions

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / "work" / "lmdbcheck"


def evict(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (they are clean: written and fsynced)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def time_checks(shards: list[Path], *, cold: bool, headers: bool = False) -> list[float]:
    """Seconds of ``check_lmdb_file`` per shard, each evicted first when ``cold``."""
    seconds = []
    for shard in shards:
        if cold:
            evict([shard])
        start = time.perf_counter()
        check_lmdb_file(str(shard), overflow_headers=headers)
        seconds.append(time.perf_counter() - start)
    return seconds


def time_opens(shards: list[Path]) -> list[float]:
    """Seconds of a whole warm ``LmdbShardReader`` open and close (check included) per shard."""
    seconds = []
    for shard in shards:
        start = time.perf_counter()
        lmdb_backend.LmdbShardReader(shard).close()
        seconds.append(time.perf_counter() - start)
    return seconds


def cold_epoch(dataset: Path, shards: list[Path], *, checked: bool) -> float:
    """Seconds to read every sample once after evicting every shard."""
    evict(shards)
    original = lmdb_backend.check_lmdb_file
    if not checked:
        lmdb_backend.check_lmdb_file = lambda path: None  # type: ignore[assignment,return-value]
    try:
        start = time.perf_counter()
        with DatasetReader(dataset) as reader:
            count = sum(1 for _ in reader)
        elapsed = time.perf_counter() - start
    finally:
        lmdb_backend.check_lmdb_file = original
    assert count == len(reader)
    return elapsed


def decoded_epoch(dataset: Path) -> float:
    """Seconds to read and decode every JPEG once (warm): the work of a real epoch."""
    from PIL import Image

    start = time.perf_counter()
    with DatasetReader(dataset) as reader:
        for sample in reader:
            Image.open(io.BytesIO(sample["image"])).convert("RGB")
    return time.perf_counter() - start


def streaming_epoch(dataset: Path) -> float:
    """Seconds of one warm ``StreamingDataset`` epoch (raw samples, main process)."""
    import shardio

    start = time.perf_counter()
    count = sum(1 for _ in shardio.StreamingDataset(dataset, decode="raw"))
    elapsed = time.perf_counter() - start
    assert count == read_manifest(dataset).num_samples
    return elapsed


def run(kind: str, num_files: int, rounds: int) -> dict[str, Any]:
    tree = ensure_tree(kind, num_files)
    dataset = WORK / f"{kind}-{num_files}-lmdb"
    if not (dataset / "manifest.json").exists():
        pack(tree.root, dataset, options=WriteOptions(backend="lmdb"), overwrite=True,
             progress=False)
    shards = [dataset / s.name for s in read_manifest(dataset).shards]
    layouts = [check_lmdb_file(str(s)) for s in shards]
    warm: list[float] = []
    cold: list[float] = []
    cold_headers: list[float] = []
    opens: list[float] = []
    epochs: dict[bool, list[float]] = {True: [], False: []}
    for number in range(rounds):
        time_checks(shards, cold=False)  # make the files warm
        warm += time_checks(shards, cold=False)
        opens += time_opens(shards)
        cold += time_checks(shards, cold=True)
        cold_headers += time_checks(shards, cold=True, headers=True)
        for checked in (True, False) if number % 2 == 0 else (False, True):
            epochs[checked].append(cold_epoch(dataset, shards, checked=checked))
    with_check, without = statistics.median(epochs[True]), statistics.median(epochs[False])
    decoded = decoded_epoch(dataset) if kind == "images" else None
    streamed = streaming_epoch(dataset)
    return {
        "question": "cost of the LMDB structure check per shard open and on a cold epoch",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_1min": os.getloadavg()[0]},
        "data": f"{num_files} {kind} files",
        "num_shards": len(shards),
        "dataset_bytes": sum(s.stat().st_size for s in shards),
        "pages_read_per_shard": statistics.median(layout.num_pages_read for layout in layouts),
        "pages_per_shard": statistics.median(layout.last_pgno + 1 for layout in layouts),
        "rounds": rounds,
        "check_warm_ms_median": 1000 * statistics.median(warm),
        "check_cold_ms_median": 1000 * statistics.median(cold),
        "check_cold_ms_median_with_overflow_headers": 1000 * statistics.median(cold_headers),
        "entries_per_shard": statistics.median(layout.num_entries for layout in layouts),
        "open_warm_ms_median": 1000 * statistics.median(opens),
        "cold_epoch_s_with_check": epochs[True],
        "cold_epoch_s_without_check": epochs[False],
        "cold_epoch_s_median_with_check": with_check,
        "cold_epoch_s_median_without_check": without,
        "cold_epoch_overhead_fraction": (with_check - without) / without,
        "checks_cold_fraction_of_epoch": statistics.median(cold) * len(shards) / without,
        "streaming_epoch_s": streamed,
        "checks_cold_fraction_of_streaming_epoch": statistics.median(cold) * len(shards)
        / streamed,
        "decoded_epoch_s": decoded,
        "checks_cold_fraction_of_decoded_epoch": (
            None if decoded is None else statistics.median(cold) * len(shards) / decoded),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("images", "tiny"), default="images")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = run(args.kind, args.files, args.rounds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"lmdbcheck-{args.kind}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
