"""Question: is reader memory bounded by ``shuffle_buffer``, and flat from one epoch to the next?

Packs the shared ImageFolder (``benchmarks/datagen.py``), then for each
``shuffle_buffer`` streams two epochs through ``shardio.loader`` in a fresh
process and samples the memory (PSS of the main process plus its DataLoader workers,
from ``/proc``) after every batch. Reports the peak per epoch and the growth
from the first epoch to the second. Writes ``benchmarks/results/memory.json``.

    python -m benchmarks.bench_memory [--quick] [--images N] [--workers 0 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.datagen import ensure_tree
from benchmarks.resultsfile import write_results

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / "work" / "memory"


def rss_bytes(pid: int) -> int:
    """Proportional set size of one process (0 if it is gone).

    PSS splits pages shared between the main process and its forked workers
    (torch's libraries, mostly) among them, so the sum over processes counts
    each page once, where a sum of RSS would count it per process.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (the DataLoader workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except FileNotFoundError:
        return []


def measure_child(path: str, shuffle_buffer: int, workers: int) -> dict[str, object]:
    """Run in a fresh process: two epochs, memory sampled after every batch."""
    import shardio

    me = os.getpid()
    dataset = shardio.StreamingDataset(path, decode="raw", shuffle_buffer=shuffle_buffer)
    run = shardio.loader(dataset, batch_size=64, num_workers=workers)
    epochs = []
    for _ in range(2):
        peak, samples = 0, 0
        for batch in run:
            samples += len(batch)
            peak = max(peak, rss_bytes(me) + sum(rss_bytes(c) for c in children(me)))
        epochs.append({"samples": samples, "peak_pss_mb": round(peak / 1e6, 1)})
    return {
        "shuffle_buffer": shuffle_buffer,
        "num_workers": workers,
        "epochs": epochs,
        "growth_mb": round(epochs[1]["peak_pss_mb"] - epochs[0]["peak_pss_mb"], 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 images, two buffer sizes")
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--buffers", type=int, nargs="+", default=None)
    parser.add_argument(
        "--child", nargs=3, metavar=("PATH", "BUFFER", "WORKERS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        path, buffer, workers = args.child
        print(json.dumps(measure_child(path, int(buffer), int(workers))))
        return
    import shardio

    tree = ensure_tree("images", args.images or (1000 if args.quick else 4000))
    out = WORK / f"images-{tree.num_files}"
    if not (out / "manifest.json").exists():
        shardio.pack(tree.root, out, overwrite=True, progress=False)
    buffers = args.buffers or ([256, 1024] if args.quick else [256, 1024, 4096])
    rows = []
    for workers in args.workers:
        for buffer in buffers:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.bench_memory",
                    "--child",
                    str(out),
                    str(buffer),
                    str(workers),
                ],
                check=True,
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent.parent,
            )
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["buffer_mb"] = round(buffer * tree.num_bytes / tree.num_files / 1e6, 1)
            rows.append(row)
            print(
                f"workers={workers} shuffle_buffer={buffer:>6} (~{row['buffer_mb']} MB of "
                f"records): peak memory (PSS) epoch 1 {row['epochs'][0]['peak_pss_mb']} MB, "
                f"epoch 2 {row['epochs'][1]['peak_pss_mb']} MB, growth {row['growth_mb']} MB"
            )
    write_results("memory.json", {
        "question": "reader memory (PSS, main + workers) against shuffle_buffer, over two epochs",
        "command": "python -m benchmarks.bench_memory" + (" " + " ".join(argv or sys.argv[1:])
                                                          if (argv or sys.argv[1:]) else ""),
        "load_avg_1min": os.getloadavg()[0],
        "dataset": {"images": tree.num_files, "bytes": tree.num_bytes},
        "rows": rows,
    })
    print(memory_block())


def memory_block(path: Path | None = None) -> str:
    """The README table of peak memory per ``shuffle_buffer``, from ``memory.json``."""
    result = json.loads((path or RESULTS / "memory.json").read_text(encoding="utf-8"))
    said = f"Measured {result['date']} on {result['machine']['cores']} cores"
    if "load_avg_1min" in result:  # results before these were recorded lack them
        said += f", 1-minute load {result['load_avg_1min']:.1f}"
    if "shardio_source" in result:
        said += f", shardio at git {result['shardio_source']['git_head']}"
    if "command" in result:
        said += f" (`{result['command']}`)"
    lines = [f"{said}; {result['dataset']['images']:,} images, "
             f"{result['dataset']['bytes'] / 1e6:,.0f} MB:", "",
             "| workers | shuffle_buffer | records in one window | peak PSS, epoch 1 | epoch 2 "
             "| growth |", "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        first, second = (e["peak_pss_mb"] for e in row["epochs"][:2])
        lines.append(f"| {row['num_workers']} | {row['shuffle_buffer']:,} | "
                     f"{row['buffer_mb']:,.0f} MB | {first:,.0f} MB | {second:,.0f} MB | "
                     f"{row['growth_mb']:+.1f} MB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
