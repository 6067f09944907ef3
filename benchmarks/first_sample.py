"""Question: how long until the first sample on a dataset of 1,000,000 samples?

The target of issue 4 is under one second: the manifest and index must not be read
sample by sample. ``shardio.ShardWriter`` writes a dataset of ``--samples`` records of
100 random bytes each (small, so the dataset is about 0.1 GB; the question is about the
per-sample metadata, not the bytes), cached under ``benchmarks/data/``. Then, for each
``num_workers`` and page-cache state, a fresh process times from building
``StreamingDataset`` + ``shardio.loader`` to the first batch of 64; the median of
``--repeats`` runs is reported. Writes ``benchmarks/results/first-sample.json``.

    python -m benchmarks.first_sample [--samples 1000000] [--repeats 3]

``time_to_first`` is the same clock for any system of the harness: ``benchmarks.run``
times it (``first`` children) on every system's pack of a 10^5-sample tree, warm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datagen import DATA_ROOT
from benchmarks.machine import describe_machine, library_versions, source_id
from benchmarks.probe import evict, median, read_all

HERE = Path(__file__).resolve().parent
PAYLOAD_BYTES = 100


def ensure_dataset(num_samples: int, *, data_root: Path = DATA_ROOT, seed: int = 0) -> Path:
    """The cached shardio dataset of ``num_samples`` small records (written once)."""
    import shardio

    out = data_root / f"shardio-records-n{num_samples}-b{PAYLOAD_BYTES}-s{seed}"
    if (out / "manifest.json").exists():
        return out
    print(f"first_sample: writing {num_samples:,} records to {out} ...", flush=True)
    rng = np.random.default_rng(seed)
    blob = rng.integers(0, 256, size=num_samples * PAYLOAD_BYTES, dtype=np.uint8).tobytes()
    with shardio.ShardWriter(out, overwrite=True) as writer:
        for i in range(num_samples):
            start = i * PAYLOAD_BYTES
            writer.write({"__key__": f"s{i:08d}", "bin": blob[start:start + PAYLOAD_BYTES]})
    return out


def time_to_first(adapter: Any, tree: Any, work: Path, spec: Any) -> dict[str, Any]:
    """Seconds from building ``adapter``'s dataset and loader to its first batch."""
    start = time.perf_counter()
    epochs = adapter.epochs(tree, work, spec)
    payloads, _ = next(iter(next(epochs)))
    seconds = time.perf_counter() - start
    epochs.close()
    return {"first_batch_s": seconds, "batch_samples": len(payloads)}


def measure(path: Path, *, num_workers: int, cache: str) -> dict[str, Any]:
    """In this (fresh) process: seconds from building the dataset to the first batch."""
    import shardio

    _ = (shardio.StreamingDataset, shardio.loader)
    files = sorted(p for p in path.iterdir() if p.is_file())
    if cache == "cold":
        evict(files)
    else:
        read_all(files)
    start = time.perf_counter()
    dataset = shardio.StreamingDataset(path, decode="raw", shuffle=True, seed=0)
    batch = next(iter(shardio.loader(dataset, batch_size=64, num_workers=num_workers)))
    seconds = time.perf_counter() - start
    return {"first_batch_s": seconds, "batch_samples": len(batch), "num_samples": len(dataset)}


def main(argv: list[str] | None = None) -> None:
    """Write (or reuse) the dataset, time the first batch in fresh processes, save JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", default="0,2")
    p.add_argument("--data-dir", type=Path, default=DATA_ROOT)
    p.add_argument("--out", type=Path, default=HERE / "results" / "first-sample.json")
    p.add_argument("--measure", nargs=3, metavar=("PATH", "WORKERS", "CACHE"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        path, workers, cache = args.measure
        print(json.dumps(measure(Path(path), num_workers=int(workers), cache=cache)))
        return
    path = ensure_dataset(args.samples, data_root=args.data_dir)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    rows: dict[str, Any] = {}
    for _ in range(args.repeats):
        for workers in (int(w) for w in args.workers.split(",")):
            for cache in ("warm", "cold"):
                cmd = [sys.executable, "-m", "benchmarks.first_sample", "--measure", str(path),
                       str(workers), cache]
                out = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True,
                                     check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
                rows.setdefault(f"w{workers}-{cache}", []).append(
                    json.loads(out.stdout.strip().splitlines()[-1]))
    result = {
        "question": "time to first sample on a dataset of N samples (target: under 1 s at 1M)",
        "date": time.strftime("%Y-%m-%d %H:%M"), "num_samples": args.samples,
        "dataset_bytes": size, "repeats": args.repeats, "machine": describe_machine(path),
        "versions": library_versions(), "shardio_source": source_id(HERE.parent / "shardio"),
        "first_batch_s": {k: median(r["first_batch_s"] for r in v) for k, v in rows.items()},
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for key, value in result["first_batch_s"].items():
        print(f"{key:10s} first batch after {value:.3f} s  (target < 1 s)")
    print(f"results: {args.out}")


def first_sample_block(path: Path | None = None) -> str:
    """The README lines on the time to the first batch, from ``first-sample.json``."""
    result = json.loads((path or HERE / "results" / "first-sample.json").read_text(
        encoding="utf-8"))
    first = result["first_batch_s"]
    source = result.get("shardio_source", {}).get("git_head", "?")
    cells = [f"{first[f'w{w}-warm']:.2f} s warm and {first[f'w{w}-cold']:.2f} s cold with {w} "
             f"worker{'s' if w != 1 else ''}" for w in sorted(
                 {int(k[1:].split("-")[0]) for k in first})]
    worst = max(first.values())
    return (f"Measured {result['date']} (shardio at git {source}, {result['num_samples']:,} "
            f"records, {result['dataset_bytes'] / 1e6:.0f} MB, median of {result['repeats']}): "
            + ", ".join(cells) + f"; target under 1 s: {'met' if worst < 1 else 'missed'}.\n")


if __name__ == "__main__":
    main()
