"""Pack throughput: how close does ``shardio.pack`` come to ``tar -cf`` of the same tree?

``tar -cf`` reads every file and writes one archive with no compression, no
checksums and no fsync: the copy limit. This benchmark packs the two shared
trees of ``benchmarks.datagen`` (an ImageFolder of photo-like JPEGs and a tree
of 1-4 KB files) with 1 and 2 workers and times ``tar -cf`` of the same tree
in the same run, interleaved, on a warm page cache (one untimed pass first),
and reports the median of ``--repeats`` runs. The target is one worker at
at least 0.8 times tar's files/s on both trees. The machine's 1-minute load
average is recorded after every round: on a shared machine it says how many
cores the workers really had.

Usage: ``python -m benchmarks.bench_pack [--quick] [--images N] [--tiny N]
[--repeats R] [--workers 1,2] [--json PATH]``. Prints a markdown table and
writes every run to a JSON file (default ``benchmarks/results/pack.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.datagen import FULL_SIZES, QUICK_SIZES, Tree, ensure_tree
from shardio.pack import pack
from shardio.writer import WriteOptions

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def time_tar(tree: Tree, work: Path) -> dict[str, float]:
    """One ``tar -cf`` of the tree into ``work``; wall and CPU seconds, and its fsync after."""
    archive = work / "tree.tar"
    archive.unlink(missing_ok=True)
    cpu = _children_cpu()
    start = time.perf_counter()
    subprocess.run(["tar", "-cf", str(archive), "-C", str(tree.root), "."], check=True)
    seconds = time.perf_counter() - start
    cpu = _children_cpu() - cpu
    start = time.perf_counter()
    fd = os.open(archive, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_s = time.perf_counter() - start
    return {"seconds": seconds, "cpu_s": cpu, "fsync_s": fsync_s,
            "output_bytes": archive.stat().st_size}


def time_pack(tree: Tree, work: Path, num_workers: int, options: WriteOptions) -> dict[str, float]:
    """One ``shardio.pack`` of the tree into ``work``; wall and CPU seconds (workers included)."""
    shutil.rmtree(work / "packed", ignore_errors=True)  # untimed, like tar's old archive
    cpu = _self_cpu() + _children_cpu()
    start = time.perf_counter()
    summary = pack(tree.root, work / "packed", options=options, num_workers=num_workers,
                   progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "cpu_s": _self_cpu() + _children_cpu() - cpu,
            "output_bytes": summary.output_bytes, "samples": summary.samples}


def bench_tree(
    tree: Tree, *, workers: list[int], repeats: int, options: WriteOptions, work: Path
) -> dict[str, Any]:
    """Interleaved repeats of tar and every worker count on one tree; medians and all runs."""
    work.mkdir(parents=True, exist_ok=True)
    time_tar(tree, work)  # warm the page cache and the disk's free space
    runs: dict[str, list[dict[str, float]]] = {"tar": []}
    runs.update({f"pack_w{w}": [] for w in workers})
    load = [os.getloadavg()[0]]
    for _ in range(repeats):
        runs["tar"].append(time_tar(tree, work))
        for w in workers:
            runs[f"pack_w{w}"].append(time_pack(tree, work, w, options))
        load.append(os.getloadavg()[0])
    medians = {}
    for name, rows in runs.items():
        seconds = statistics.median(r["seconds"] for r in rows)
        medians[name] = {
            "seconds": seconds,
            "cpu_s": statistics.median(r["cpu_s"] for r in rows),
            "files_per_s": tree.num_files / seconds,
            "mb_per_s": tree.num_bytes / 1e6 / seconds,
        }
    tar = medians["tar"]
    tar["fsync_s"] = statistics.median(r["fsync_s"] for r in runs["tar"])
    synced_fps = tree.num_files / (tar["seconds"] + tar["fsync_s"])
    for row in medians.values():
        row["vs_tar"] = row["files_per_s"] / tar["files_per_s"]
        row["vs_tar_fsync"] = row["files_per_s"] / synced_fps
    shutil.rmtree(work / "packed", ignore_errors=True)
    (work / "tree.tar").unlink(missing_ok=True)
    return {"kind": tree.kind, "num_files": tree.num_files, "num_bytes": tree.num_bytes,
            "medians": medians, "runs": runs, "load_average_1min": load}


def markdown(results: list[dict[str, Any]], workers: list[int]) -> str:
    """The results as the markdown table of ``benchmarks/README.md``."""
    head = "| tree | files | MB | tar files/s (+fsync) | " + " | ".join(
        f"pack {w}w files/s | × tar (+fsync) | pack {w}w MB/s" for w in workers) + " |"
    lines = [head, "|" + "---|" * (4 + 3 * len(workers))]
    for res in results:
        med = res["medians"]
        tar = med["tar"]
        synced = res["num_files"] / (tar["seconds"] + tar["fsync_s"])
        cells = [res["kind"], f"{res['num_files']:,}", f"{res['num_bytes'] / 1e6:,.0f}",
                 f"{tar['files_per_s']:,.0f} ({synced:,.0f})"]
        for w in workers:
            row = med[f"pack_w{w}"]
            cells += [f"{row['files_per_s']:,.0f}",
                      f"{row['vs_tar']:.2f} ({row['vs_tar_fsync']:.2f})",
                      f"{row['mb_per_s']:,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small shared trees")
    parser.add_argument("--images", type=int, help=f"JPEGs (default {FULL_SIZES['images']})")
    parser.add_argument("--tiny", type=int, help=f"tiny files (default {FULL_SIZES['tiny']})")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per setting")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--codec", default="zstd", choices=("zstd", "none"))
    parser.add_argument("--json", type=Path, default=HERE / "results" / "pack.json")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    default = QUICK_SIZES if args.quick else FULL_SIZES
    sizes = {"images": args.images or default["images"], "tiny": args.tiny or default["tiny"]}
    options = WriteOptions(codec=args.codec)
    results = []
    for kind, num_files in sizes.items():
        tree = ensure_tree(kind, num_files)
        results.append(bench_tree(tree, workers=workers, repeats=args.repeats,
                                  options=options, work=WORK / "bench_pack"))
        print(f"{kind}: done", flush=True)
    report = {
        "question": "pack files/s and MB/s against tar -cf of the same tree",
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cores": len(os.sched_getaffinity(0)), "cpu": _cpu_model()},
        "codec": args.codec, "repeats": args.repeats, "workers": workers, "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(markdown(results, workers))
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
