"""Pack throughput: how close does ``shardio.pack`` come to ``tar -cf`` of the same tree?

``tar -cf`` reads every file and writes one archive with no compression, no
checksums and no fsync: the copy limit. This benchmark packs the two shared
trees of ``benchmarks.datagen`` (an ImageFolder of photo-like JPEGs and a tree
of 1-4 KB files) with each ``--workers`` count and times ``tar -cf`` of the
same tree in the same round, on a warm page cache (one untimed pass first);
the order of the settings rotates from round to round.
Each pack runs in a fresh process and is timed inside it (interpreter start-up
excluded). ``--baseline REV`` also times the ``shardio`` package of git
revision ``REV`` (extracted with ``git archive``) in the same rounds, so a
change is compared with what it replaces under the same load. ``--dask-workers
N`` also times ``pack(engine="dask")`` on a ``distributed.LocalCluster`` of N
single-threaded worker processes, started once per tree before the rounds (its
start-up is recorded, not timed with the packs), each pack connecting to it by
address from a fresh process; its CPU seconds include the workers'. Targets
(issue 9): local pack with default workers at least 0.8 times tar's files/s on
both trees, dask on one machine at least 0.8 times the local pack.

The machine is shared, so rates drift with other jobs: "× tar" is the median
over rounds of tar's time / pack's time *in the same round*, and the 1-minute
load average is recorded after every round.

Usage: ``python -m benchmarks.bench_pack [--quick] [--images N] [--tiny N]
[--repeats R] [--workers 1,2] [--dask-workers N] [--codec zstd|none] [--baseline REV]
[--json PATH]``.
Prints a markdown table and writes every run to a JSON file (default
``benchmarks/results/pack.json``).
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
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.datagen import FULL_SIZES, QUICK_SIZES, Tree, ensure_tree
from benchmarks.resultsfile import command_line, write_results

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"

CHILD = """
import json, resource, sys, time
from shardio.packing.pack import pack
from shardio.packing.writer import WriteOptions

def cpu():
    return sum(u.ru_utime + u.ru_stime for u in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))

src, out, workers, codec, scheduler = sys.argv[1:6]
engine = "dask" if scheduler else "local"
if scheduler:
    import shardio.packing.engines.dask  # imports are not timed, as for the local pack
cpu0, start = cpu(), time.perf_counter()
summary = pack(src, out, options=WriteOptions(codec=codec), num_workers=int(workers),
               progress=False, engine=engine, scheduler=scheduler or None)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "cpu_s": cpu() - cpu0, "samples": summary.samples,
                  "output_bytes": summary.output_bytes,
                  "module": sys.modules["shardio"].__file__}))
"""
"""One timed pack, run as ``python -P -c CHILD SRC OUT WORKERS CODEC SCHEDULER`` in a fresh
process (``SCHEDULER`` empty for the local engine).

``-P`` keeps the working directory off ``sys.path``, so ``PYTHONPATH`` decides
which ``shardio`` is timed; the child reports the module it imported.
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
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


def time_pack(
    tree: Tree, work: Path, num_workers: int, codec: str, source: Path | None = None,
    cluster: DaskCluster | None = None,
) -> dict[str, Any]:
    """One ``shardio.pack`` of the tree into ``work`` in a fresh process; wall and CPU seconds.

    ``source`` is a folder holding another ``shardio`` package to time instead
    of the installed one. CPU seconds include the pack's worker processes, or
    with ``cluster`` (engine dask) the cluster's.
    """
    shutil.rmtree(work / "packed", ignore_errors=True)  # untimed, like tar's old archive
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), env.get("PYTHONPATH", "")])
    workers_cpu = cluster.cpu_s() if cluster is not None else 0.0
    done = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(tree.root), str(work / "packed"), str(num_workers),
         codec, cluster.address if cluster is not None else ""], check=True, capture_output=True,
        text=True, env=env)
    result: dict[str, Any] = json.loads(done.stdout)
    if cluster is not None:  # the driver's CPU and the workers', apart: the 10^7 estimate
        result["driver_cpu_s"] = result["cpu_s"]
        result["workers_cpu_s"] = cluster.cpu_s() - workers_cpu
        result["cpu_s"] += result["workers_cpu_s"]
    expected = (source or HERE.parent) / "shardio"
    if Path(result["module"]).parent != expected:
        raise RuntimeError(f"timed {result['module']}, expected the shardio in {expected}")
    # results are committed: keep the repository's location on this machine out of them
    module = Path(result["module"])
    inside = module.is_relative_to(HERE.parent)
    result["module"] = module.relative_to(HERE.parent).as_posix() if inside else module.name
    return result


def extract_revision(rev: str, work: Path) -> Path:
    """The ``shardio`` package of git revision ``rev``, extracted under ``work``."""
    target = work / f"baseline-{rev}"
    if not (target / "shardio" / "__init__.py").exists():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", rev, "shardio"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


class DaskCluster:
    """``shardio.packing.engines.dask.local_cluster``, a client, and the CPU time of its workers."""

    def __init__(self, num_workers: int) -> None:
        import distributed
        import psutil  # a dependency of distributed

        from shardio.packing.engines.dask import local_cluster

        start = time.perf_counter()
        self.cluster = local_cluster(num_workers)  # the cluster pack itself would start
        self.client = distributed.Client(self.cluster, set_as_default=False)
        self.client.wait_for_workers(num_workers)
        self.start_s = time.perf_counter() - start
        self.address: str = self.cluster.scheduler_address
        self.processes = [psutil.Process(pid) for pid in self.client.run(os.getpid).values()]

    def cpu_s(self) -> float:
        """User + system seconds the worker processes have run so far."""
        return sum(p.cpu_times().user + p.cpu_times().system for p in self.processes)

    def close(self) -> None:
        """Stop the workers and the scheduler."""
        self.client.close()
        self.cluster.close()


def bench_tree(
    tree: Tree, *, workers: list[int], repeats: int, codec: str, work: Path,
    baseline: tuple[str, Path] | None = None, dask_workers: int = 0,
) -> dict[str, Any]:
    """Interleaved rounds of tar and every pack setting on one tree; medians and all runs."""
    work.mkdir(parents=True, exist_ok=True)
    time_tar(tree, work)  # warm the page cache and the disk's free space
    settings: list[tuple[str, int, Path | None]] = [(f"pack_w{w}", w, None) for w in workers]
    if baseline is not None:
        settings += [(f"{baseline[0]}_w{w}", w, baseline[1]) for w in workers]
    cluster = DaskCluster(dask_workers) if dask_workers else None
    if dask_workers:
        settings.append((f"dask_w{dask_workers}", dask_workers, None))
    runs: dict[str, list[dict[str, Any]]] = {"tar": []}
    runs.update({name: [] for name, _, _ in settings})
    load = [os.getloadavg()[0]]
    order: list[tuple[str, int, Path | None]] = [("tar", 0, None), *settings]
    try:
        for round_ in range(repeats):
            # rotate: whatever runs first in a round pays for the memory the last one left dirty
            for name, w, source in order[round_ % len(order):] + order[:round_ % len(order)]:
                if name == "tar":
                    runs["tar"].append(time_tar(tree, work))
                else:
                    runs[name].append(time_pack(tree, work, w, codec, source, cluster
                                                if name.startswith("dask") else None))
            load.append(os.getloadavg()[0])
    finally:
        if cluster is not None:
            cluster.close()
    tar_s = [r["seconds"] for r in runs["tar"]]
    synced_s = [r["seconds"] + r["fsync_s"] for r in runs["tar"]]
    medians = {}
    for name, rows in runs.items():
        seconds = statistics.median(r["seconds"] for r in rows)
        medians[name] = {
            "seconds": seconds,
            "cpu_s": statistics.median(r["cpu_s"] for r in rows),
            **{k: statistics.median(r[k] for r in rows)
               for k in ("driver_cpu_s", "workers_cpu_s") if k in rows[0]},
            "files_per_s": tree.num_files / seconds,
            "mb_per_s": tree.num_bytes / 1e6 / seconds,
            "vs_tar": statistics.median(
                t / r["seconds"] for t, r in zip(tar_s, rows, strict=True)),
            "vs_tar_fsync": statistics.median(
                t / r["seconds"] for t, r in zip(synced_s, rows, strict=True)),
        }
    medians["tar"]["fsync_s"] = statistics.median(r["fsync_s"] for r in runs["tar"])
    if dask_workers and f"pack_w{dask_workers}" in runs:  # the local pack, same rounds
        local = runs[f"pack_w{dask_workers}"]
        medians[f"dask_w{dask_workers}"]["vs_local"] = statistics.median(
            a["seconds"] / b["seconds"]
            for a, b in zip(local, runs[f"dask_w{dask_workers}"], strict=True))
    shutil.rmtree(work / "packed", ignore_errors=True)
    (work / "tree.tar").unlink(missing_ok=True)
    return {"kind": tree.kind, "num_files": tree.num_files, "num_bytes": tree.num_bytes,
            "medians": medians, "runs": runs, "load_average_1min": load,
            "dask_cluster_start_s": None if cluster is None else cluster.start_s}


def markdown(results: list[dict[str, Any]], workers: list[int], baseline: str | None, *,
             bold_workers: int | None = None) -> str:
    """The results as a markdown table (``benchmarks/README.md`` shows it through ``pack_report``).

    Args:
        results: ``bench_tree``'s results, one per tree.
        workers: the worker counts timed.
        baseline: the git revision also timed, or ``None``.
        bold_workers: the worker count whose "× tar" is set in bold (the default, all cores).
    """
    head = "| tree | files | MB | tar files/s (+fsync) | " + " | ".join(
        f"pack {w}w files/s | × tar (+fsync)" for w in workers)
    if baseline is not None:
        head += " | " + " | ".join(f"before ({baseline}) {w}w × tar (+fsync)" if i == 0
                                   else f"before {w}w × tar (+fsync)"
                                   for i, w in enumerate(workers))
    columns = 4 + 2 * len(workers) + (len(workers) if baseline is not None else 0)
    lines = [head + " |", "|" + "---|" * columns]
    for res in results:
        med = res["medians"]
        tar = med["tar"]
        synced = res["num_files"] / (tar["seconds"] + tar["fsync_s"])
        cells = [res["kind"], f"{res['num_files']:,}", f"{res['num_bytes'] / 1e6:,.0f}",
                 f"{tar['files_per_s']:,.0f} ({synced:,.0f})"]
        for w in workers:
            row = med[f"pack_w{w}"]
            ratio = f"{row['vs_tar']:.2f} ({row['vs_tar_fsync']:.2f})"
            cells += [f"{row['files_per_s']:,.0f}", f"**{ratio}**" if w == bold_workers else ratio]
        for w in workers if baseline is not None else []:
            row = med[f"{baseline}_w{w}"]
            cells.append(f"{row['vs_tar']:.2f} ({row['vs_tar_fsync']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small shared trees")
    parser.add_argument("--images", type=int, help=f"JPEGs (default {FULL_SIZES['images']})")
    parser.add_argument("--tiny", type=int, help=f"tiny files (default {FULL_SIZES['tiny']})")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per tree")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--dask-workers", type=int, default=0, metavar="N",
                        help="also time engine dask on a local cluster of N workers")
    parser.add_argument("--codec", default="zstd", choices=("zstd", "none"))
    parser.add_argument("--baseline", metavar="REV",
                        help="also time the shardio package of this git revision")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "pack.json")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    default = QUICK_SIZES if args.quick else FULL_SIZES
    sizes = {"images": args.images or default["images"], "tiny": args.tiny or default["tiny"]}
    work = WORK / "bench_pack"
    baseline = None
    if args.baseline:
        baseline = (args.baseline, extract_revision(args.baseline, work))
    results = []
    for kind, num_files in sizes.items():
        tree = ensure_tree(kind, num_files)
        results.append(bench_tree(tree, workers=workers, repeats=args.repeats,
                                  codec=args.codec, work=work, baseline=baseline,
                                  dask_workers=args.dask_workers))
        print(f"{kind}: done", flush=True)
    report = {
        "question": "pack files/s and MB/s against tar -cf of the same tree",
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cores": len(os.sched_getaffinity(0)), "cpu": _cpu_model()},
        "codec": args.codec, "repeats": args.repeats, "workers": workers,
        "dask_workers": args.dask_workers, "baseline": args.baseline, "results": results,
        "command": command_line("benchmarks.bench_pack", argv or sys.argv[1:]),
    }
    write_results(args.json, report, command=report["command"])
    print(markdown(results, workers, args.baseline))
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
