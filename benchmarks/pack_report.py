"""README blocks of pack throughput, rendered from committed results only.

* ``tar_block``: ``bench_pack`` with 1 and 2 workers against ``tar -cf`` and the
  revision before whole-shard workers, with codec zstd (``results/pack.json``) and
  none (``results/pack-codec-none.json``): the rates and ratios, the CPU per file,
  the scaling from 1 to 2 workers, and issue 2's target (one worker at least 0.8
  times tar).
* ``engines_block``: ``bench_pack --dask-workers 2`` (``results/pack-engines.json``):
  files/s and MB/s of tar, the local pack with 1 and 2 workers and the dask
  pack on a local cluster of 2 workers, in the same rounds; the ratios against
  tar and against the local pack; the load average over the rounds.
* ``scan_block``: ``bench_scan`` (``results/pack-scan.json``): the walk and plan
  per file with each way of walking and N walk tasks.
* ``estimate_block``: the wall time of a pack of 10^7 files on 8 and 64 workers,
  from the dask packs' measured CPU: the driver's (serial, per file and per
  shard) and the workers' (divided by the number of workers), and the driver's
  memory.

Registered in ``benchmarks/readme.py`` (``BLOCKS``); nothing here is typed by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.bench_pack import markdown
from shardio.packing.plan import target_shard_bytes

RESULTS = Path(__file__).resolve().parent / "results"
ESTIMATE_FILES = 10**7
ESTIMATE_WORKERS = (8, 64)
TAR_FILES = {"pack.json": "zstd", "pack-codec-none.json": "none"}
"""``bench_pack``'s results of the two codecs (``--codec``), shown by ``tar_block``."""


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    return data


def _span(values: list[float]) -> str:
    """``min–max`` with one decimal, or one figure when both round alike."""
    low, high = f"{min(values):.1f}", f"{max(values):.1f}"
    return low if low == high else f"{low}–{high}"


def tar_block() -> str:
    """Pack against tar, 1 and 2 workers and the baseline, from ``pack.json`` and
    ``pack-codec-none.json``."""
    reports = {codec: _load(name) for name, codec in TAR_FILES.items()}
    first = next(iter(reports.values()))
    machine = first["machine"]
    system, release = machine["platform"].split("-")[:2]
    lines = [
        f"{first['date']}, {machine['cores']} cores ({machine['cpu']}), {system} {release}, "
        f"Python {machine['python']}; medians of {first['repeats']} rounds. \"× tar\" is the "
        "median over rounds of tar's time / pack's time in the same round; \"(+fsync)\" counts "
        "the fsync of tar's archive in tar's time; \"before\" is the `shardio` of "
        f"{first['baseline']}, timed in the same rounds.",
    ]
    for (name, codec), report in zip(TAR_FILES.items(), reports.values(), strict=True):
        load = [x for res in report["results"] for x in res["load_average_1min"]]
        default = " (the default)" if codec == "zstd" else ""
        lines += ["", f"`--codec {codec}`{default}: `benchmarks/results/{name}`, "
                  f"{report['repeats']} rounds, 1-minute load average {_span(load)} "
                  "(our own processes included):", "",
                  markdown(report["results"], report["workers"], report["baseline"],
                           bold_workers=report["machine"]["cores"])]
    lines += ["", *_tar_cpu(reports), "", *_tar_targets(reports)]
    return "\n".join(lines)


def _tar_cpu(reports: dict[str, dict[str, Any]]) -> list[str]:
    """CPU per file of tar and pack, the 1-worker pack's wait, and the all-cores speed-up."""
    n = next(iter(reports.values()))["machine"]["cores"]
    lines = [
        f"CPU µs per file (all processes) and the speed-up from 1 to {n} workers (files/s, "
        "medians); \"waits\" is a 1-worker pack's wall time less its CPU time, mostly the "
        "fsync of its shards:",
        "",
        f"| tree | codec | tar CPU | pack 1w CPU | pack {n}w CPU | pack 1w waits "
        f"| pack {n}w ÷ 1w | before {n}w ÷ 1w |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [(res, codec, report["baseline"]) for codec, report in reports.items()
            for res in report["results"]]
    for res, codec, base in sorted(rows, key=lambda row: row[0]["kind"]):
        med = res["medians"]

        def cpu(name: str, res: dict[str, Any] = res) -> str:
            return f"{res['medians'][name]['cpu_s'] / res['num_files'] * 1e6:.1f}"

        one, all_ = med["pack_w1"], med[f"pack_w{n}"]
        lines.append(
            f"| {res['kind']} | {codec} | {cpu('tar')} | {cpu('pack_w1')} | {cpu(f'pack_w{n}')} "
            f"| {one['seconds'] - one['cpu_s']:.2f} s "
            f"| {all_['files_per_s'] / one['files_per_s']:.2f}× "
            f"| {med[f'{base}_w{n}']['files_per_s'] / med[f'{base}_w1']['files_per_s']:.2f}× |")
    return lines


def _tar_targets(reports: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 2's target (one worker ≥ 0.8× tar), and where all cores bring pack."""
    kinds = [res["kind"] for res in next(iter(reports.values()))["results"]]
    cores = next(iter(reports.values()))["machine"]["cores"]

    def median(kind: str, codec: str, name: str, key: str) -> float:
        res = next(r for r in reports[codec]["results"] if r["kind"] == kind)
        value: float = res["medians"][name][key]
        return value

    def ratios(name: str, key: str = "vs_tar") -> str:
        return "; ".join(f"{kind} " + ", ".join(f"{median(kind, codec, name, key):.2f}× ({codec})"
                                                for codec in reports) for kind in kinds)

    one = [median(kind, codec, "pack_w1", "vs_tar") for kind in kinds for codec in reports]
    return [
        f"* Issue 2, one worker ≥ 0.8× tar: {ratios('pack_w1')}: "
        + ("met." if min(one) >= 0.8 else "**missed**."),
        f"* With {cores} workers (the default, all cores): {ratios(f'pack_w{cores}')} tar; "
        f"against tar + fsync {ratios(f'pack_w{cores}', 'vs_tar_fsync')}.",
    ]


def _rate(res: dict[str, Any], name: str) -> str:
    row = res["medians"][name]
    return f"{row['files_per_s']:,.0f} ({row['mb_per_s']:,.0f} MB/s)"


def engines_block() -> str:
    """The pack engines against tar, from ``results/pack-engines.json``."""
    report = _load("pack-engines.json")
    n = report["dask_workers"]
    lines = [
        f"`{report['command']}` — {report['date']}, {report['machine']['cores']} cores, "
        f"{report['repeats']} rounds, codec {report['codec']}; medians; \"×\" is the median "
        "of the per-round ratios.",
        "",
        f"| tree | files | MB | tar -cf files/s | local 1w | × tar | local {n}w (default) "
        f"| × tar | dask {n}w | × tar | × local {n}w | load avg (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in report["results"]:
        med = res["medians"]
        load = res["load_average_1min"]
        lines.append(
            f"| {res['kind']} | {res['num_files']:,} | {res['num_bytes'] / 1e6:,.0f} "
            f"| {_rate(res, 'tar')} | {_rate(res, 'pack_w1')} | {med['pack_w1']['vs_tar']:.2f} "
            f"| {_rate(res, f'pack_w{n}')} | **{med[f'pack_w{n}']['vs_tar']:.2f}** "
            f"| {_rate(res, f'dask_w{n}')} | {med[f'dask_w{n}']['vs_tar']:.2f} "
            f"| **{med[f'dask_w{n}']['vs_local']:.2f}** | {min(load):.1f}–{max(load):.1f} |")
    starts = ", ".join(f"{r['kind']} {r['dask_cluster_start_s']:.1f} s"
                       for r in report["results"])
    lines += ["", f"Starting the local cluster ({n} worker processes) took {starts}; it is "
              "started once per tree, before the rounds, and not in these times.", ""]
    lines += _targets(report)
    return "\n".join(lines)


def _targets(report: dict[str, Any]) -> list[str]:
    """The issue's two targets, met or missed, and the CPU per file that decides them."""
    n = report["dask_workers"]
    results = report["results"]

    def verdict(ratios: list[float]) -> str:
        return "met" if min(ratios) >= 0.8 else "**missed**"

    local = [r["medians"][f"pack_w{n}"]["vs_tar"] for r in results]
    dask = [r["medians"][f"dask_w{n}"]["vs_local"] for r in results]
    cpu = "; ".join(
        f"{r['kind']}: tar {r['medians']['tar']['cpu_s'] / r['num_files'] * 1e6:.1f}, "
        f"local pack {r['medians']['pack_w1']['cpu_s'] / r['num_files'] * 1e6:.1f}, dask pack "
        f"{r['medians'][f'dask_w{n}']['cpu_s'] / r['num_files'] * 1e6:.1f}" for r in results)
    return [
        f"* Local pack with the default workers ({n}) ≥ 0.8× tar: "
        + ", ".join(f"{r['kind']} {x:.2f}×" for r, x in zip(results, local, strict=True))
        + f": {verdict(local)}.",
        f"* Dask on one machine ≥ 0.8× the local pack ({n} workers each): "
        + ", ".join(f"{r['kind']} {x:.2f}×" for r, x in zip(results, dask, strict=True))
        + f": {verdict(dask)}.",
        f"* CPU µs per file (all processes; the pack with 1 worker): {cpu}.",
    ]


SCAN_NAMES = {"serial": "local, walked in the driver", "processes": "local, 2 processes",
              "threads": "local, 2 threads"}


def scan_block() -> str:
    """The walk and plan per file, from ``results/pack-scan.json``."""
    report = _load("pack-scan.json")
    lines = [
        f"`{report['command']}` — {report['date']}, {report['cores']} cores, "
        f"{report['repeats']} rounds; medians, µs per file.",
        "",
        "| tree | walk | tasks | scan wall | driver CPU | tasks' CPU | plan (driver) "
        "| driver memory, B/file | load avg (1 min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in report["results"]:
        load = res["load_average_1min"]
        for name, row in res["medians"].items():
            label = SCAN_NAMES.get(name) or f"dask, 2 workers, {name.split('_')[-1]} tasks asked"
            lines.append(
                f"| {res['kind']} | {label} | {row['tasks']:.0f} | {row['scan_us']:.1f} "
                f"| {row['driver_cpu_us']:.1f} | {row['tasks_cpu_us']:.1f} "
                f"| {row['plan_cpu_us']:.1f} | {row['rss_bytes_per_file']:,.0f} "
                f"| {min(load):.1f}–{max(load):.1f} |")
    return "\n".join(lines)


def shards_of(num_bytes: float, max_shard_bytes: int = 256 * 10**6) -> int:
    """About how many shards ``pack`` cuts ``num_bytes`` of input into (``shardplan``'s rule)."""
    return max(1, math.ceil(num_bytes / target_shard_bytes(int(num_bytes), max_shard_bytes)))


def driver_costs(results: list[dict[str, Any]], name: str) -> tuple[float, float]:
    """The driver's CPU ``(µs per file, ms per shard)`` fitted to both trees' dask packs.

    Its work per file (merging the walk, planning, sending samples) hardly depends on
    the file's size, its work per shard (submitting, journaling, fsync) not at all, so
    two trees with different files-per-shard give both; per file only if they do not.
    """
    (f1, s1, t1), (f2, s2, t2) = [(r["num_files"], shards_of(r["num_bytes"]),
                                   r["medians"][name]["driver_cpu_s"]) for r in results[:2]]
    det = f1 * s2 - f2 * s1
    per_file, per_shard = (t1 * s2 - t2 * s1) / det, (f1 * t2 - f2 * t1) / det
    if per_file <= 0 or per_shard < 0:
        return max(t1 / f1, t2 / f2) * 1e6, 0.0
    return per_file * 1e6, per_shard * 1e3


def estimate_s(driver_per_file_us: float, driver_per_shard_ms: float, workers_per_file_us: float,
               shards: int, workers: int, files: int = ESTIMATE_FILES) -> float:
    """Seconds: the driver's work is serial, the workers' divides by ``workers``."""
    return (files * (driver_per_file_us + workers_per_file_us / workers) / 1e6
            + shards * driver_per_shard_ms / 1e3)


def estimate_block() -> str:
    """Wall time for 10^7 files on 8 and 64 workers, from the measured CPU."""
    packs = _load("pack-engines.json")
    scans = {r["kind"]: r for r in _load("pack-scan.json")["results"]}
    name = f"dask_w{packs['dask_workers']}"
    per_file, per_shard = driver_costs(packs["results"], name)
    head = " | ".join(f"{w} workers" for w in ESTIMATE_WORKERS)
    lines = [
        f"T(W) = files × {per_file:.1f} µs + shards × {per_shard:.1f} ms (the driver's CPU, "
        "serial: fitted to both trees' dask packs above) + files × the workers' CPU per "
        "file / W (from the same tree's pack). Memory: the driver's growth while scanning "
        "and planning (`bench_scan`, the largest of its settings), times 10^7.",
        "",
        f"| files like | workers' CPU µs/file | shards of 256 MB | {head} | driver memory |",
        "|---|---|---|" + "---|" * len(ESTIMATE_WORKERS) + "---|",
    ]
    for res in packs["results"]:
        workers = res["medians"][name]["workers_cpu_s"] / res["num_files"] * 1e6
        per_file_bytes = res["num_bytes"] / res["num_files"]
        shards = shards_of(ESTIMATE_FILES * per_file_bytes)
        memory = max(r["rss_bytes_per_file"] for r in scans[res["kind"]]["medians"].values())
        cells = " | ".join(f"{estimate_s(per_file, per_shard, workers, shards, w) / 60:,.1f} min"
                           for w in ESTIMATE_WORKERS)
        lines.append(f"| {res['kind']} ({per_file_bytes / 1e3:,.1f} KB) | {workers:.1f} "
                     f"| {shards:,} | {cells} | {ESTIMATE_FILES * memory / 1e9:,.0f} GB |")
    return "\n".join(lines)
