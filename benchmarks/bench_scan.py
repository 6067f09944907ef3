"""Scan cost: what walking SRC and planning its shards cost per file, with N walk tasks.

Before a pack reads any file, its driver walks SRC (in tasks: ``shardio.packing.scan``),
merges the tasks' samples, shuffles them and cuts the shards. This benchmark
times that part alone on the two shared trees of ``benchmarks.datagen``, in a
fresh process per run (imports excluded, the cyclic GC paused as ``pack``
pauses it), with

* the local engine's three ways of walking on 2 workers: in the driver
  (``serial``), in 2 forked processes, in 2 threads, with the engine's budget
  of 4,096 entries per task, or less so that at least 8 tasks walk the tree;
* the dask engine on a ``distributed.LocalCluster`` of 2 worker processes,
  with the walk budget set so that about N tasks walk the tree besides the
  driver's first share (N = 2, 8, 32).

Per file it reports the wall time, the driver's CPU (the serial part: its own
share of the walk, receiving and merging the parts), the tasks' CPU (forked
children, or the cluster's workers: the part that divides by the number of
workers), the plan (shuffle, size bounds, cuts and running totals, as
``pack`` does them) and the driver's resident memory growth (the source and
the shuffled stream it keeps). The rounds rotate the
order of the settings; the 1-minute load average is recorded after each round
(the machine is shared). ``benchmarks.pack_report`` turns these figures and
those of ``bench_pack --dask-workers`` into the README's tables and its
estimate for 10^7 files.

Usage: ``python -m benchmarks.bench_scan [--quick] [--images N] [--tiny N] [--repeats R]
[--json PATH]`` (default ``benchmarks/results/pack-scan.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench_pack import DaskCluster
from benchmarks.datagen import FULL_SIZES, QUICK_SIZES, Tree, ensure_tree

HERE = Path(__file__).resolve().parent
TASKS = (2, 8, 32)
"""Walk tasks of the dask runs (about: the budget is entries / (N + 1))."""

CHILD = """
import gc, itertools, json, random, resource, sys, time
gc.disable()
from shardio.packing.plan import framed_bounds, plan_shards
src, how, scheduler, budget = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tasks = []
if how == "dask":
    import shardio.packing.engines.dask as dask_engine
    dask_engine.MAX_ENTRIES = budget
    engine = dask_engine.DaskEngine(scheduler=scheduler)
    pool_class = dask_engine.DaskWalkPool
else:
    from shardio.packing.engines.local import ExecutorWalkPool, LocalEngine
    engine = LocalEngine(2, scan_with=how, max_walk_entries=budget)
    pool_class = ExecutorWalkPool
submit = pool_class.submit
def counting(self, spec, folders):
    tasks.append(len(folders))
    submit(self, spec, folders)
pool_class.submit = counting

def usage(who):
    u = resource.getrusage(who)
    return u.ru_utime + u.ru_stime

def rss():  # resident now (not the peak, which imports may have set higher)
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()

rss0 = rss()
cpu0, kids0 = usage(resource.RUSAGE_SELF), usage(resource.RUSAGE_CHILDREN)
start = time.perf_counter()
source = engine.scan(src, imagefolder=None, include=(), exclude=(), follow_symlinks=False)
scan_s, cpu1 = time.perf_counter() - start, usage(resource.RUSAGE_SELF)
order = list(range(len(source.samples)))
random.Random(0).shuffle(order)
stream = [source.samples[i] for i in order]
plan = plan_shards(framed_bounds(stream), max_shard_bytes=256 * 10**6)
files_upto = list(itertools.accumulate((len(s.paths) for s in stream), initial=0))
bytes_upto = list(itertools.accumulate((s.num_bytes for s in stream), initial=0))
plan_s = time.perf_counter() - start - scan_s
cpu2, rss1 = usage(resource.RUSAGE_SELF), rss()
print(json.dumps({"files": files_upto[-1], "scan_s": scan_s, "driver_cpu_s": cpu1 - cpu0,
                  "children_cpu_s": usage(resource.RUSAGE_CHILDREN) - kids0,
                  "plan_s": plan_s, "plan_cpu_s": cpu2 - cpu1, "tasks": len(tasks),
                  "rss_growth_bytes": rss1 - rss0}))
engine.close()
"""
"""One timed scan: ``python -P -c CHILD SRC HOW SCHEDULER BUDGET`` (HOW: serial, processes,
threads or dask)."""


def scan_once(tree: Tree, how: str, budget: int, cluster: DaskCluster) -> dict[str, Any]:
    """One scan of ``tree`` in a fresh process; the tasks' CPU from children or the cluster."""
    before = cluster.cpu_s()
    done = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(tree.root), how, cluster.address, str(budget)],
        check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout)
    workers = cluster.cpu_s() - before if how == "dask" else 0.0
    result["tasks_cpu_s"] = result.pop("children_cpu_s") + workers
    if how == "threads":  # the threads ran in the driver: its CPU is theirs too
        result["tasks_cpu_s"] = 0.0
    return result


def bench_tree(tree: Tree, *, repeats: int, cluster: DaskCluster) -> dict[str, Any]:
    """Rotated rounds of every setting on one tree: medians per file and every run."""
    entries = sum(1 + len(d) + len(f) for _, d, f in os.walk(tree.root))  # what a walk counts
    local = min(4096, entries // 8 + 1)  # at least 8 tasks: the engine's budget, or less
    settings = [("serial", "serial", local), ("processes", "processes", local),
                ("threads", "threads", local)]
    settings += [(f"dask_{n}", "dask", entries // (n + 1) + 1) for n in TASKS]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in settings}
    load = [os.getloadavg()[0]]
    scan_once(tree, "serial", 4096, cluster)  # warm the page cache
    for round_ in range(repeats):
        for name, how, budget in settings[round_ % len(settings):] + settings[
                :round_ % len(settings)]:
            runs[name].append(scan_once(tree, how, budget, cluster))
        load.append(os.getloadavg()[0])
    medians = {}
    for name, rows in runs.items():
        files = rows[0]["files"]
        medians[name] = {
            "tasks": statistics.median(r["tasks"] for r in rows),
            **{f"{k[:-2]}_us": statistics.median(r[k] for r in rows) / files * 1e6
               for k in ("scan_s", "driver_cpu_s", "tasks_cpu_s", "plan_s", "plan_cpu_s")},
            "rss_bytes_per_file": statistics.median(r["rss_growth_bytes"] for r in rows) / files,
        }
    return {"kind": tree.kind, "num_files": tree.num_files, "num_bytes": tree.num_bytes,
            "medians": medians, "runs": runs, "load_average_1min": load}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small shared trees")
    parser.add_argument("--images", type=int, help=f"JPEGs (default {FULL_SIZES['images']})")
    parser.add_argument("--tiny", type=int, help=f"tiny files (default {FULL_SIZES['tiny']})")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per tree")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "pack-scan.json")
    args = parser.parse_args(argv)
    default = QUICK_SIZES if args.quick else FULL_SIZES
    sizes = {"images": args.images or default["images"], "tiny": args.tiny or default["tiny"]}
    cluster = DaskCluster(2)
    try:
        results = [bench_tree(ensure_tree(kind, n), repeats=args.repeats, cluster=cluster)
                   for kind, n in sizes.items()]
    finally:
        cluster.close()
    report = {
        "question": "scan and plan cost per file, with N walk tasks",
        "date": datetime.date.today().isoformat(), "cores": len(os.sched_getaffinity(0)),
        "repeats": args.repeats, "results": results,
        "command": " ".join(["python -m benchmarks.bench_scan", *(argv or sys.argv[1:])]),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    for res in results:
        for name, med in res["medians"].items():
            print(res["kind"], name, {k: round(v, 2) for k, v in med.items()})
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
