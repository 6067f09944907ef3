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

Each with ``verify=True`` (the default) and ``verify=False``, the four alternated within
each round in a rotated order, each epoch timed from building its dataset and loader (the
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
from benchmarks.resultsfile import load_results, write_results

WORK = Path(__file__).resolve().parent / "work" / "warm"
BATCH = 64
WAYS = ("shardio.loader", "DataLoader")


def _batches(way: str, pack: Path, verify: bool, seed: int) -> Iterable[Any]:
    import shardio

    dataset = shardio.StreamingDataset(pack, decode="raw", seed=seed, verify=verify)
    if way == "shardio.loader":
        return shardio.loader(dataset, batch_size=BATCH, num_workers=0)
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=BATCH, num_workers=0, collate_fn=list)


def measure_pack(pack: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per warm epoch of ``pack`` (``seconds``) and to its first batch
    (``first_batch_s``), per way and ``verify``, one figure a round.

    Raises:
        RuntimeError: an epoch delivered another number of samples than the pack holds.
    """
    import shardio

    expected = sum(shard.num_samples for shard in shardio.read_manifest(pack).shards)
    for path in pack.iterdir():
        path.read_bytes()
    settings = [(way, verify) for way in WAYS for verify in (True, False)]
    seconds: dict[str, list[float]] = {f"{w} verify={v}": [] for w, v in settings}
    first: dict[str, list[float]] = {name: [] for name in seconds}
    for r in range(rounds + 1):
        for way, verify in settings[r % len(settings):] + settings[:r % len(settings)]:
            start = time.perf_counter()
            first_batch, samples = 0.0, 0
            for batch in _batches(way, pack, verify, seed=r):
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
    }, command=" ".join(["python -m benchmarks.bench_warm", *(argv or sys.argv[1:])]))
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
             "checks, µs a sample | checks' share |", "|---|---|---|---|---|---|---|"]
    for tree in results["trees"]:
        n = tree["num_files"]
        for way in WAYS:
            on = statistics.median(tree["seconds"][f"{way} verify=True"])
            off = statistics.median(tree["seconds"][f"{way} verify=False"])
            wait = statistics.median(tree["first_batch_s"][f"{way} verify=True"])
            lines.append(f"| {tree['kind']} ({n:,}) | `{way}` | {1e6 * on / n:.2f} | "
                         f"{n / on:,.0f} | {1e3 * wait:.0f} | {1e6 * off / n:.2f} | "
                         f"{100 * (1 - off / on):.1f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
