"""Warm raw epochs, one process, before and after format v2's reads (issue 10, items 1-3).

Renders the README block ``bench-warm`` from two results files of the harness
(``benchmarks/run.py``), each restricted to the warm raw epoch with 0 workers:
``results/warm-before.json`` (shardio as of 2a934e5, the last commit before format
v2) and ``results/warm-after.json`` (this tree). Each run measures shardio through
``shardio.loader`` (``shardio-records``) and through a plain ``DataLoader`` with the
user's own collate (``shardio-records-dataloader``) against the best peer measured
in the same rounds (a single LMDB file, LitData). Ratios compare figures of one run.

    python -m benchmarks.warm_report [FILE_BEFORE FILE_AFTER]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
METRIC = "raw-w0-warm"
SHARDIO = {"shardio-records": "shardio.loader", "shardio-records-dataloader": "plain DataLoader"}
TARGET = 1.5


def _run(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _describe(label: str, results: dict[str, Any]) -> str:
    src = results.get("shardio_source") or {}
    load = results.get("load_avg_1min")
    if isinstance(load, dict):  # newer runs: start, end, median and max of the samples
        load = [load["start"], load["end"]]
    loads = f", 1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end" if (
        load) else ""
    return (f"*{label}*: {results['date']}, shardio at git {src.get('git_head') or '2a934e5'}, "
            f"`python -m benchmarks.run {' '.join(results.get('argv') or [])}`, median of "
            f"{results['repeats']} repeat(s){loads}.")


def warm_block(before: Path | None = None, after: Path | None = None) -> str:
    """The README block: samples/s and ratio to the best peer, before and after, per tree."""
    runs = {"before": _run(before or RESULTS / "warm-before.json"),
            "after": _run(after or RESULTS / "warm-after.json")}
    lines = [_describe(label, res) for label, res in runs.items()]
    lines += ["", "| tree | read through | before: samples/s | x best peer | after: samples/s | "
              "x best peer | x best peer, after / before | target >= 1.5x best peer |",
              "|---|---|---|---|---|---|---|---|"]
    for kind in ("images", "tiny"):
        for system, how in SHARDIO.items():
            cells = []
            ratio_after = None
            values: dict[str, float] = {}
            for label, res in runs.items():
                row = res["datasets"].get(kind, {}).get("ratios", {}).get(METRIC, {}).get(system)
                if row is None:
                    cells += ["-", "-"]
                    continue
                values[label] = row["vs_best_peer"]
                peer = row["best_peer"]
                peer_value = res["datasets"][kind]["ratios"][METRIC][peer]["value"]
                cells += [f"{row['value']:,.0f}",
                          f"{row['vs_best_peer']:.2f} ({peer} {peer_value:,.0f})"]
                if label == "after":
                    ratio_after = row["vs_best_peer"]
            gain = (f"{values['after'] / values['before']:.2f}x" if len(values) == 2 else "-")
            met = "-" if ratio_after is None else ("met" if ratio_after >= TARGET else
                                                   f"**missed** by {TARGET / ratio_after:.2f}x")
            lines.append(f"| {kind} | {how} | {' | '.join(cells)} | {gain} | {met} |")
    return "\n".join(lines) + "\n"


WORKERS_METRIC = "raw-w2-warm"
"""The epoch ``dataloader_block`` compares with ``METRIC``, in the same run."""


def dataloader_block(before: Path | None = None, after: Path | None = None) -> str:
    """The README block ``bench-dataloader-workers``: a plain ``DataLoader`` with 2 workers
    against one process, before and after samples crossed as places in their files."""
    runs = {"before": _run(before or RESULTS / "dataloader-workers-before.json"),
            "after": _run(after or RESULTS / "dataloader-workers-after.json")}
    system = "shardio-records-dataloader"
    lines = [_describe(label, res) for label, res in runs.items()]
    lines += ["", "| tree | before: 2 workers, samples/s | x 1 process | x best peer | "
              "after: 2 workers, samples/s | x 1 process | x best peer | "
              "target: 2 workers >= 1.0x 1 process |", "|---|---|---|---|---|---|---|---|"]
    for kind in ("images", "tiny"):
        cells: list[str] = []
        own = None
        for res in runs.values():
            ratios = res["datasets"].get(kind, {}).get("ratios", {})
            two, one = (ratios.get(m, {}).get(system) for m in (WORKERS_METRIC, METRIC))
            if two is None or one is None:
                cells += ["-", "-", "-"]
                own = None
                continue
            own = two["value"] / one["value"]
            peer = two["best_peer"]
            rate = ratios[WORKERS_METRIC][peer]["value"]
            cells += [f"{two['value']:,.0f}", f"{own:.2f}",
                      f"{two['vs_best_peer']:.2f} ({peer} {rate:,.0f})"]
        met = "-" if own is None else ("met" if own >= 1.0 else f"**missed** by {1.0 / own:.2f}x")
        lines.append(f"| {kind} | {' | '.join(cells)} | {met} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:3]]
    print(warm_block(*paths) if len(paths) == 2 else warm_block())
