"""Question: what does the always-on telemetry of ``shardio.loader`` cost a warm epoch?

``loader.stats()`` takes a few clock reads and appends per batch (``shardio.reading.telemetry``).
Here one process reads warm epochs of tiny records (the case where per-batch overhead
weighs most: little work per batch) with the telemetry on and with it off
(``telemetry.ENABLED = False``, the internal switch), in the same rounds, the order
rotated each round, through loaders built once per variant (workers persistent, so
the epochs timed are warm); with 0 workers (the clock reads on the loop's own path)
and 2. Reports per variant the median epoch seconds, and the median over rounds of the
on/off ratio (on this shared machine noisier than the cost), and the telemetry's own
per-batch cost timed alone as a share of the epoch; each figure the mean of several epochs. Writes
``benchmarks/results/telemetry.json`` (``--quick``: fewer rounds).

    benchmarks/.env/bin/python -m benchmarks.bench_telemetry [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.datagen import QUICK_SIZES, ensure_tree
from benchmarks.machine import describe_machine, library_versions, source_id

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "telemetry"
BATCHES = (16, 64)


def epoch_s(loader: Any, epochs: int = 1) -> float:
    """Seconds per epoch, over ``epochs`` warm epochs."""
    began = time.perf_counter()
    for _ in range(epochs):
        for _ in loader:
            pass
    return (time.perf_counter() - began) / epochs


def per_batch_s() -> float:
    """Seconds the telemetry adds per batch, timed alone, as the loop of a loader without
    workers pays them: the dataset's clock reads (4), the loop's (2), the stage tuple
    with the shard opens, and one ``LoaderStats.record``."""
    from shardio.reading import telemetry
    stats = telemetry.LoaderStats(telemetry.WORKER_STAGES, counts=("shard_opens",))
    now, count = time.perf_counter, 200_000
    began = now()
    for _ in range(count):
        a, b, c, d = now(), now(), now(), now()
        opens = telemetry.shard_opens - 0
        stats.record(a, now(), (b - a, c - b, d - c, 0.0, opens))
    return (now() - began) / count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 9")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "telemetry.json")
    args = parser.parse_args(argv)
    import shardio
    from shardio.reading import telemetry
    tree = ensure_tree("tiny", QUICK_SIZES["tiny"])
    pack = WORK / f"tiny-{tree.num_files}"
    if not (pack / "manifest.json").exists():
        shardio.pack(tree.root, pack, num_workers=1, progress=False)
    rounds, epochs = (3, 3) if args.quick else (9, 8)
    results: dict[str, Any] = {}
    for workers in (0, 2):
        for batch in BATCHES:
            loaders = {}
            for enabled in (True, False):  # built (and its workers forked) under its switch
                telemetry.ENABLED = enabled
                loader = shardio.loader(shardio.StreamingDataset(pack, decode="raw"), batch,
                                        num_workers=workers)
                epoch_s(loader)  # warm: workers started, pages cached
                loaders[enabled] = loader
            times: dict[bool, list[float]] = {True: [], False: []}
            ratios = []
            for r in range(rounds):
                order = (True, False) if r % 2 == 0 else (False, True)
                now = {}
                for enabled in order:
                    telemetry.ENABLED = enabled
                    now[enabled] = epoch_s(loaders[enabled], epochs)
                    times[enabled].append(now[enabled])
                ratios.append(now[True] / now[False])
            telemetry.ENABLED = True
            steps = len(loaders[True])
            cost = per_batch_s()
            name = f"raw-tiny-w{workers}-b{batch}"
            results[name] = {
                "num_workers": workers, "batch_size": batch, "batches": steps,
                "epoch_on_s": statistics.median(times[True]),
                "epoch_off_s": statistics.median(times[False]),
                "ratio_on_off": statistics.median(ratios),
                "ratios": ratios,
                "telemetry_per_batch_us": 1e6 * cost,
                "overhead_pct": 100 * cost * steps / statistics.median(times[False]),
            }
            print(f"{name}: {steps} batches, on {results[name]['epoch_on_s']:.3f} s, off "
                  f"{results[name]['epoch_off_s']:.3f} s, ratio "
                  f"{results[name]['ratio_on_off']:.4f}; {1e6 * cost:.2f} us a batch alone = "
                  f"{results[name]['overhead_pct']:.2f}% of the epoch", flush=True)
            del loaders
    out = {
        "question": "cost of shardio.loader's always-on telemetry in a warm epoch",
        "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": rounds,
        "epochs_per_round": epochs,
        "samples": tree.num_files, "load_avg_1m": os.getloadavg()[0],
        "machine": describe_machine(WORK), "libraries": library_versions(),
        "shardio": source_id(HERE.parent / "shardio"), "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
