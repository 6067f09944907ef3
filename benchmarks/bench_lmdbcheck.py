"""Question: what does the LMDB structure check cost per shard open (warm, cold) and per epoch?

``shardio.backends.lmdbcheck.check_lmdb_file`` runs on every open of an LMDB shard
(issue 7): it reads the meta pages and every branch and leaf page (the header of
every overflow run too only with ``overflow_headers=True``, timed here apart as
"with headers"). This packs the shared ImageFolder (``benchmarks/datagen.py``,
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
so the check reads every page of the file. Writes ``benchmarks/results/lmdbcheck-KIND.json``;
``lmdbcheck_block`` renders both kinds' results as the table of ``benchmarks/README.md``
(block ``lmdb-check`` of ``benchmarks/readme.py``).

    python -m benchmarks.bench_lmdbcheck [--kind images|tiny] [--files 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import shardio.backends.lmdb as lmdb_backend
from benchmarks.datagen import ensure_tree
from shardio.backends.lmdbcheck import check_lmdb_file
from shardio.format.manifest import read_manifest
from shardio.packing.pack import pack
from shardio.packing.writer import WriteOptions
from shardio.reading.reader import DatasetReader

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / "work" / "lmdbcheck"
BLOCK_KINDS = {"images": "JPEGs", "tiny": "files of 1-4 KB"}
"""The results ``lmdbcheck_block`` shows (``lmdbcheck-KIND.json``), with what their files are."""


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


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if value < 1 else f"{value:.1f} ms"


def _count(value: float) -> str:
    """A median count rounded half up (a median of an even number of shards may end in .5)."""
    return f"{math.floor(value + 0.5):,}"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2g}%"


def lmdbcheck_block() -> str:
    """The README table and figures of the check's cost, from ``lmdbcheck-{images,tiny}.json``."""
    results = {kind: json.loads((RESULTS / f"lmdbcheck-{kind}.json").read_text(encoding="utf-8"))
               for kind in BLOCK_KINDS}
    loads = sorted(f"{r['machine']['load_1min']:.1f}" for r in results.values())
    dates = sorted({r["date"] for r in results.values()})
    rounds = sorted({r["rounds"] for r in results.values()})
    lines = [
        f"{' and '.join(dates)}, {results['images']['machine']['cpus']}-core machine shared "
        f"with other jobs (1-minute load average {'–'.join(dict.fromkeys([loads[0], loads[-1]]))} "
        f"at the end), Python {results['images']['machine']['python']}, "
        f"{' and '.join(map(str, rounds))} rounds; medians:",
        "",
        "| data (LMDB pack) | pages read / pages per shard | check, warm | cold "
        "| cold, with headers | all shards cold / raw cold epoch | / `StreamingDataset` epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, label in BLOCK_KINDS.items():
        r = results[kind]
        lines.append(
            f"| {int(r['data'].split()[0]):,} {label}, {r['dataset_bytes'] / 1e6:,.0f} MB, "
            f"{r['num_shards']} shards | {_count(r['pages_read_per_shard'])} / "
            f"{_count(r['pages_per_shard'])} | {_ms(r['check_warm_ms_median'])} "
            f"| {_ms(r['check_cold_ms_median'])} "
            f"| {_ms(r['check_cold_ms_median_with_overflow_headers'])} "
            f"| {_percent(r['checks_cold_fraction_of_epoch'])} "
            f"({r['cold_epoch_s_median_with_check']:.2f} s epoch) "
            f"| {_percent(r['checks_cold_fraction_of_streaming_epoch'])} "
            f"({r['streaming_epoch_s']:.1f} s) |")
    lines += ["", *_lmdbcheck_notes(results)]
    return "\n".join(lines) + "\n"


def _lmdbcheck_notes(results: dict[str, dict[str, Any]]) -> list[str]:
    """The figures the table's text needs: epochs with and without the check, opens, pages."""
    def spread(r: dict[str, Any]) -> tuple[float, float]:
        epochs = r["cold_epoch_s_with_check"] + r["cold_epoch_s_without_check"]
        return min(epochs), max(epochs)

    gaps = [abs(r["cold_epoch_s_median_with_check"] - r["cold_epoch_s_median_without_check"])
            < spread(r)[1] - spread(r)[0] for r in results.values()]
    epochs = ", ".join(
        f"{kind} {100 * r['cold_epoch_overhead_fraction']:+.1f}% (epochs "
        f"{spread(r)[0]:.2f}–{spread(r)[1]:.2f} s)" for kind, r in results.items())
    opens = ", ".join(
        f"{kind} {_ms(r['open_warm_ms_median'])} (the check {_ms(r['check_warm_ms_median'])})"
        for kind, r in results.items())
    shards = "; ".join(
        f"{kind} {r['dataset_bytes'] / r['num_shards'] / 1e6:,.0f} MB, "
        f"{_count(r['pages_read_per_shard'])} of {_count(r['pages_per_shard'])}"
        for kind, r in results.items())
    most = [(kind, r) for kind, r in results.items()
            if r["pages_read_per_shard"] >= r["pages_per_shard"] / 2]
    per_record = "".join(
        f" The check reads most of a {kind} shard: {_count(r['entries_per_shard'])} records, "
        f"{r['check_warm_ms_median'] * 1e3 / r['entries_per_shard']:.1f} µs per record per warm "
        "check." for kind, r in most)
    headers = ", ".join(
        f"{kind} {r['check_cold_ms_median_with_overflow_headers'] / r['check_cold_ms_median']:.2g}×"
        for kind, r in results.items())
    lines = [
        f"* Cold epoch with the check against without: {epochs}: "
        + ("less than the run-to-run spread." if all(gaps) else "**more than the spread**."),
        f"* A whole warm open of a shard: {opens}.",
        f"* A shard's size, and the pages the check reads of it: {shards}.{per_record}",
        f"* Reading the overflow headers too, cold: {headers} the check's cost.",
    ]
    decoded = [(kind, r) for kind, r in results.items() if r["decoded_epoch_s"] is not None]
    lines += [f"* With Pillow decoding every JPEG ({kind}): all shards' cold checks are "
              f"{_percent(r['checks_cold_fraction_of_decoded_epoch'])} of the warm epoch "
              f"({r['decoded_epoch_s']:.1f} s)." for kind, r in decoded]
    return lines


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
