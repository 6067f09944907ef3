"""Question: what does a warm epoch cost per sample, each way a user reads, and what share of
it do the record checks take?

The harness (``run.py``) gives warm epochs against the peers; this takes shardio's own warm
epoch apart. One process, every shard in the page cache, raw samples (nothing decoded),
batches of 64, the shared trees (``benchmarks/datagen.py``) packed with ``shardio.pack``'s
defaults. Two ways of reading the same pack:

* ``shardio.loader``: ``shardio.loader(StreamingDataset(decode="raw"))``, each batch a
  ``RecordBatch`` (one buffer and offsets);
* ``DataLoader``: a plain ``torch.utils.data.DataLoader(StreamingDataset(decode="raw"),
  batch_size=64)`` whose collate keeps the list of sample dicts, what a user's own collate
  starts from.

and random access, what a map-style user reads through:

* ``IndexedDataset``: a ``DataLoader(IndexedDataset(decode="raw"), batch_size=64,
  shuffle=True)``, a fresh dataset each epoch (its block cache empty); ``IndexedDataset,
  2nd epoch`` times the second epoch of one dataset (every block already decoded);
* the single LMDB file of the harness (``benchmarks/adapters/lmdb_file.py``) written from
  the same tree, one ``txn.get`` a sample under the same random sampler: the baseline the
  random reads are given as a ratio to.

Each shardio way with ``verify=True`` (the default) and ``verify=False``, all alternated
within each round in a rotated order, each epoch timed from building its dataset and loader (the
first round only warms the process). Per tree and way: microseconds per sample (median
over rounds) with and without the checks, the checks' share, ``1 - off / on``, and the
wait for the first batch, which the epoch includes (its window is read before it). Writes
``benchmarks/results/warm.json``; ``warm_block`` renders the README table from it.

    python -m benchmarks.bench_warm [--quick] [--rounds 5] [--images N] [--tiny N]

To measure a commit rather than the working tree, point ``BENCH_SHARDIO_SNAPSHOT`` at a
checkout of it (``git worktree add``); ``benchmarks/__init__.py`` imports that ``shardio``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.datagen import FULL_SIZES, QUICK_SIZES, ensure_tree
from benchmarks.resultsfile import command_line, load_results, write_results

WORK = Path(__file__).resolve().parent / "work" / "warm"
BATCH = 64
INDEXED, AGAIN, LMDB_FILE = "IndexedDataset", "IndexedDataset, 2nd epoch", "single LMDB file"
WAYS = ("shardio.loader", "DataLoader", INDEXED, AGAIN)
RANDOM = (INDEXED, AGAIN)


def _batches(way: str, pack: Path, verify: bool, seed: int) -> Iterable[Any]:
    import torch
    from torch.utils.data import DataLoader

    import shardio

    if way in (*RANDOM, LMDB_FILE):
        dataset: Any = (shardio.IndexedDataset(pack, decode="raw", verify=verify)
                        if way in RANDOM else _lmdb_file(pack))
        return DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=list,
                          generator=torch.Generator().manual_seed(seed))
    dataset = shardio.StreamingDataset(pack, decode="raw", seed=seed, verify=verify)
    if way == "shardio.loader":
        return shardio.loader(dataset, batch_size=BATCH, num_workers=0)
    return DataLoader(dataset, batch_size=BATCH, num_workers=0, collate_fn=list)


def _lmdb_file(pack: Path) -> Any:
    from benchmarks.adapters.lmdb_file import LmdbFileDataset

    return LmdbFileDataset(_lmdb_path(pack), decode=False, fields=("payload",))


def _lmdb_path(pack: Path) -> Path:
    return pack.parent / f"{pack.name}.lmdb-file"


def write_lmdb_file(pack: Path) -> None:
    """The harness's single LMDB file of ``pack``'s samples, beside it: one value a sample,
    its label and its one payload field (``pack`` holds one field besides its label)."""
    import shardio
    from benchmarks.adapters.lmdb_file import write_labelled

    with shardio.DatasetReader(pack) as reader:
        samples = (reader.get(i) for i in range(len(reader)))
        write_labelled(_lmdb_path(pack), ((int(s.get("label", 0)), next(
            v for v in s.values() if isinstance(v, bytes))) for s in samples))


def measure_pack(pack: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per warm epoch of ``pack`` (``seconds``) and to its first batch
    (``first_batch_s``), per way and ``verify``, one figure a round; the single LMDB
    file's random epoch too where ``write_lmdb_file`` wrote it.

    Raises:
        RuntimeError: an epoch delivered another number of samples than the pack holds.
    """
    import shardio

    expected = sum(shard.num_samples for shard in shardio.read_manifest(pack).shards)
    for path in pack.iterdir():
        path.read_bytes()
    settings = [(way, verify) for way in WAYS for verify in (True, False)]
    if _lmdb_path(pack).exists():
        settings.append((LMDB_FILE, True))
    seconds: dict[str, list[float]] = {f"{w} verify={v}": [] for w, v in settings}
    first: dict[str, list[float]] = {name: [] for name in seconds}
    for r in range(rounds + 1):
        for way, verify in settings[r % len(settings):] + settings[:r % len(settings)]:
            start = time.perf_counter()
            batches = _batches(way, pack, verify, seed=r)
            if way == AGAIN:  # the first epoch fills the block cache; the second is timed
                for _ in batches:
                    pass
                start = time.perf_counter()
            first_batch, samples = 0.0, 0
            for batch in batches:
                first_batch = first_batch or time.perf_counter() - start
                samples += len(batch)
            took = time.perf_counter() - start
            if samples != expected:
                raise RuntimeError(f"{way} verify={verify}: {samples} samples, not {expected}")
            if r:  # the first round warms the process (imports, allocator, page tables)
                seconds[f"{way} verify={verify}"].append(took)
                first[f"{way} verify={verify}"].append(first_batch)
    return {"seconds": seconds, "first_batch_s": first}


def measure(kind: str, num_files: int, rounds: int) -> dict[str, Any]:
    """One tree of ``datagen``, packed with ``shardio.pack``'s defaults, measured."""
    import shardio

    tree = ensure_tree(kind, num_files)
    pack = WORK / tree.root.name
    if not (pack / "manifest.json").exists():
        shardio.pack(tree.root, pack, seed=0, overwrite=True, progress=False)
    if not _lmdb_path(pack).exists():
        write_lmdb_file(pack)
    return {"kind": kind, "num_files": tree.num_files, "bytes": tree.num_bytes,
            "pack_bytes": sum(p.stat().st_size for p in pack.iterdir()),
            **measure_pack(pack, rounds)}


def main(argv: list[str] | None = None) -> Path:
    """Measure both trees; returns the results file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the small trees, 2 rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--images", type=int, help="JPEGs (default 8,000; quick 1,000)")
    p.add_argument("--tiny", type=int, help="tiny files (default 100,000; quick 10,000)")
    p.add_argument("--out", type=Path, default=None, help="default benchmarks/results/warm.json")
    args = p.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    load = [os.getloadavg()[0]]
    trees = [measure(kind, getattr(args, kind) or sizes[kind], rounds)
             for kind in ("images", "tiny")]
    load.append(os.getloadavg()[0])
    out = write_results(args.out or "warm.json", {
        "question": __doc__.split("\n\n")[0].removeprefix("Question: ").replace("\n", " "),
        "rounds": rounds, "batch_size": BATCH, "load_avg_1min": load, "trees": trees,
    }, command=command_line("benchmarks.bench_warm", argv or sys.argv[1:]))
    print(warm_block(out))
    return out


def warm_block(path: Path | None = None) -> str:
    """The README table: µs per sample each way, with and without the checks."""
    results = (json.loads(path.read_text(encoding="utf-8")) if path
               else load_results("warm.json"))
    src = results["shardio_source"]
    lines = [f"Measured {results['date']} (`{results['command']}`, shardio at git "
             f"{src['git_head']}{' with uncommitted changes' if src['dirty'] else ''}) on "
             f"{results['machine']['cores']} cores, 1-minute load average "
             f"{results['load_avg_1min'][0]:.1f} before, {results['load_avg_1min'][1]:.1f} "
             f"after; one process, warm, raw samples, batches of {results['batch_size']}, "
             f"medians of {results['rounds']} rounds:", "",
             "| tree | read through | µs a sample | samples/s | first batch, ms | without the "
             "checks, µs a sample | checks' share | random reads: the LMDB file's time over "
             "this |", "|---|---|---|---|---|---|---|---|"]
    for tree in results["trees"]:
        n, times = tree["num_files"], tree["seconds"]
        base = times.get(f"{LMDB_FILE} verify=True")
        for way in (*WAYS, LMDB_FILE):
            if f"{way} verify=True" not in times:
                continue
            on = statistics.median(times[f"{way} verify=True"])
            wait = statistics.median(tree["first_batch_s"][f"{way} verify=True"])
            off = times.get(f"{way} verify=False")
            unchecked = ("no checks | —" if off is None else
                         f"{1e6 * statistics.median(off) / n:.2f} | "
                         f"{100 * (1 - statistics.median(off) / on):.1f}%")
            ratio = (f"{statistics.median(base) / on:.2f}×"
                     if base and way in (*RANDOM, LMDB_FILE) else "")
            lines.append(f"| {tree['kind']} ({n:,}) | `{way}` | {1e6 * on / n:.2f} | "
                         f"{n / on:,.0f} | {1e3 * wait:.0f} | {unchecked} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
