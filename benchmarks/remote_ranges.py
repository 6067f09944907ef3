"""Remote fetch ranges: one cold shardio epoch through a slow link, per range size and budget.

**Question:** reading a records pack from S3 (s3rver behind the storage proxy: 20 ms
per request, 100 MB/s shared), how do samples/s, time to the first batch, bytes
downloaded per dataset byte and the cache's high-water mark depend on the size of
the ranges the remote reader fetches (``RemoteOptions.range_bytes``) and on a budget
that holds the dataset (``fits``) or half of it (``half``)?

``python -m benchmarks.remote_ranges [--images 2000] [--range-mb 16,2] [--workers 0,2]``
packs the generated ImageFolder tree (``datagen``), uploads it once, then reads one
cold epoch per setting in this process with ``shardio.loader`` (batches of 64, raw
samples), each with a fresh, empty cache folder sampled every 10 ms, and prints one
line per setting; ``--out`` also writes them as JSON. Every epoch is checked to yield
each sample exactly once. A shared machine: compare settings of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import shardio
from benchmarks.datagen import DATA_ROOT, ensure_tree
from benchmarks.remote_servers import (
    BUCKET,
    FolderSampler,
    S3rver,
    s3_client,
    s3_environment,
    upload_folder,
)
from benchmarks.storage_proxy import FaultProxy

HERE = Path(__file__).resolve().parent


def cold_epoch(url: str, proxy: FaultProxy, cache: Path, *, range_bytes: int,
               budget: int | None, workers: int, latency_s: float,
               bytes_per_s: float) -> dict[str, Any]:
    """One epoch from an empty cache; what it cost."""
    shutil.rmtree(cache, ignore_errors=True)
    proxy.plan.reset(latency_s=latency_s, max_bytes_per_s=bytes_per_s)
    options = shardio.RemoteOptions(cache_dir=cache, max_cache_bytes=budget,
                                    range_bytes=range_bytes)
    ds = shardio.StreamingDataset(url, decode="raw", remote=options)
    seen: list[int] = []
    with FolderSampler(cache, interval_s=0.01) as sampler:
        start = time.perf_counter()
        first = None
        for batch in shardio.loader(ds, batch_size=64, num_workers=workers):
            if first is None:
                first = time.perf_counter() - start
            seen.extend(batch.indices.tolist())
        seconds = time.perf_counter() - start
    assert sorted(seen) == list(range(len(ds))), "an epoch must yield every sample once"
    return {"samples_per_s": len(seen) / seconds, "first_batch_s": first,
            "get_bytes": proxy.plan.get_bytes, "gets": proxy.plan.gets,
            "cache_peak_bytes": sampler.peak(), "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000, help="JPEG count of the generated tree")
    p.add_argument("--range-mb", default="16,2", help="range sizes in MiB (comma-separated)")
    p.add_argument("--workers", default="0,2", help="num_workers values")
    p.add_argument("--budgets", default="fits,half", help="fits, half or both")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbs", type=float, default=100.0)
    p.add_argument("--work-dir", type=Path, default=HERE / "work" / "remote-ranges")
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = p.parse_args()

    tree = ensure_tree("images", args.images, data_root=DATA_ROOT)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    packed = args.work_dir / "pack"
    shardio.pack(tree.root, packed)
    stored = sum(f.stat().st_size for f in packed.iterdir())
    server = S3rver(args.work_dir / "s3", log=args.work_dir / "s3rver.log")
    proxy = FaultProxy(("127.0.0.1", server.port))
    rows = []
    try:
        upload_folder(s3_client(server.url), packed, "ds")
        os.environ.update(s3_environment(proxy.url))
        url = f"s3://{BUCKET}/ds"
        for mib in (int(m) for m in args.range_mb.split(",")):
            for name in args.budgets.split(","):
                for workers in (int(w) for w in args.workers.split(",")):
                    budget = None if name == "fits" else stored // 2
                    row: dict[str, Any] = {"range_mib": mib, "budget": name,
                                           "workers": workers}
                    try:
                        row.update(cold_epoch(
                            url, proxy, args.work_dir / "cache", range_bytes=mib << 20,
                            budget=budget, workers=workers, latency_s=args.latency_ms / 1e3,
                            bytes_per_s=args.bandwidth_mbs * 1e6))
                        print(f"range {mib:>2} MiB  {name:<4}  workers={workers}  "
                              f"{row['samples_per_s']:6.0f} samples/s  first batch "
                              f"{row['first_batch_s']:.2f} s  downloaded "
                              f"{row['get_bytes'] / stored:.2f}x  cache peak "
                              f"{row['cache_peak_bytes'] / 1e6:.0f} MB"
                              f"{'' if budget is None else f' (budget {budget / 1e6:.0f} MB)'}",
                              flush=True)
                    except shardio.ShardioError as exc:
                        row["error"] = f"{type(exc).__name__}: {exc}"
                        print(f"range {mib:>2} MiB  {name:<4}  workers={workers}  "
                              f"{row['error'][:160]}", flush=True)
                    rows.append(row)
    finally:
        proxy.close()
        server.close()
    if args.out is not None:
        args.out.write_text(json.dumps({"dataset_bytes": stored, "images": args.images,
                                        "latency_ms": args.latency_ms,
                                        "bandwidth_mbs": args.bandwidth_mbs, "rows": rows},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
