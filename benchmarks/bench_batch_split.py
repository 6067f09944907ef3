"""Question: what do whole batches in turn cost a worker's reads, against contiguous parts?

``shardio.loader`` and ``StreamingDataset(batch_size=)`` give worker ``k`` the
batches ``k, k + W, …`` of its rank's order (every batch full, the order
independent of ``W``, resume by one position); before, each worker read a
contiguous part of the stream in its own shuffle windows. A worker's share of
a window is then scattered over the window's blocks, so its reads are shorter
runs. This packs small records (1-4 KB, where per-read overhead shows most),
then, in one process with a warm page cache, times the reads of worker 0's
order both ways for W = 1, 2, 4, 8: process CPU time per sample, median of 3.
Writes ``benchmarks/results/batch_split.json``.

    python -m benchmarks.bench_batch_split [--samples 60000] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import statistics
import time
from pathlib import Path

from shardio import ShardWriter, WriteOptions
from shardio.order.plan import IndexArray, Split, interleave_batches, plan_epoch
from shardio.reading.reader import DatasetReader
from shardio.reading.stream import iter_samples
from shardio.torch.dataset import StreamingDataset

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / "work" / "batch_split"


def make_pack(root: Path, samples: int) -> Path:
    """``samples`` records of 1-4 KB of seeded random bytes, 5,000 per shard."""
    if root.exists():
        shutil.rmtree(root)
    rng = random.Random(0)
    with ShardWriter(root, WriteOptions(max_shard_samples=5000)) as writer:
        for i in range(samples):
            writer.write({"__key__": f"s/{i:06d}", "bin": rng.randbytes(rng.randint(1024, 4096))})
    return root


def us_per_sample(reader: DatasetReader, order: IndexArray, window: int, block: int) -> float:
    """Median of 3 reads of ``order``: process CPU microseconds per sample."""
    runs = []
    for _ in range(3):
        start = time.process_time()
        for _sample in iter_samples(reader, order, window=window, max_run=block):
            pass
        runs.append((time.process_time() - start) / len(order) * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60000)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    root = make_pack(WORK / "ds", args.samples)
    config = StreamingDataset(root, decode="raw").config
    reader = DatasetReader(root)
    rank_order = plan_epoch(config, 0, Split())
    us_per_sample(reader, rank_order, config.window, config.block_size)  # warm the page cache
    rows = []
    for workers in (1, 2, 4, 8):
        contiguous = plan_epoch(config, 0, Split(0, 1, 0, workers))
        batched = interleave_batches(rank_order, args.batch_size, 0, workers)
        row = {
            "num_workers": workers,
            "contiguous_us": us_per_sample(reader, contiguous, config.window, config.block_size),
            "batches_in_turn_us": us_per_sample(reader, batched, config.window, config.block_size),
        }
        rows.append(row)
        print(f"W={workers}: contiguous {row['contiguous_us']:.2f} us/sample, "
              f"whole batches in turn {row['batches_in_turn_us']:.2f} us/sample")
    reader.close()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_split.json").write_text(json.dumps({
        "question": __doc__.splitlines()[0],
        "samples": args.samples, "batch_size": args.batch_size,
        "window": config.window, "block_size": config.block_size,
        "machine": platform.platform(), "rows": rows,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
