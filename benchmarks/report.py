"""Results JSON -> the markdown tables of ``benchmarks/README.md``.

``python -m benchmarks.report RESULTS.json`` prints the tables of any results file;
``tables_block`` renders them from the latest committed full run, then from the latest
``*-quick-shapes.json`` (every data shape and issue 29's rows), for the ``bench-tables``
block of ``benchmarks/README.md``, and ``--update-readme`` rewrites every generated block
(``benchmarks/readme.py``; nothing else in the READMEs is touched).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.adapters import BASELINE, SYSTEMS
from benchmarks.headline import latest_full_run
from benchmarks.readme import RESULTS, write_blocks

ISSUE_29 = ("random access x single LMDB file", "warm epoch x single LMDB file",
            "warm epoch with checksums / without (checks' share < 5%)")
"""The targets issue 29 added on the trees issue 4 already had."""
EPOCHS = ("raw-w0-warm", "raw-w0-warm-nocheck", "random-w0-warm", "raw-w0-cold", "raw-w2-warm",
          "raw-w2-cold", "decoded-w2-warm")
"""Columns: ``-nocheck`` is shardio without checksums, ``random-`` map-style random access."""


def _num(value: Any, digits: int = 0) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _cell(ds: dict[str, Any], metric: str, name: str) -> str:
    row = ds["ratios"].get(metric, {}).get(name)
    if row is None:
        sysres = ds["systems"][name]
        if sysres["status"] != "ok":
            return "n/a"
        runs = sysres["epochs"].get(metric) if metric != "pack" else sysres["pack"]
        return "failed" if runs and runs.get("error") else "-"
    parts = []
    if name != BASELINE and row["vs_baseline"]:
        parts.append(f"{row['vs_baseline']:.2f}x base")
    if row["vs_best_peer"] and name != row["best_peer"]:
        parts.append(f"{row['vs_best_peer']:.2f}x {row['best_peer']}")
    return _num(row["value"]) + (f" ({', '.join(parts)})" if parts else "")


def _systems(ds: dict[str, Any]) -> list[str]:
    return [n for n in SYSTEMS if n in ds["systems"]]


def throughput_table(ds: dict[str, Any]) -> list[str]:
    """Samples/s per epoch configuration; ratios to the baseline and to the best peer."""
    cols = [c for c in EPOCHS if c in ds["ratios"]]
    lines = ["| system | " + " | ".join(cols) + " | cold `cat` of its files |",
             "|---" * (len(cols) + 2) + "|"]
    for name in _systems(ds):
        sysres = ds["systems"][name]
        if sysres["status"] == "skipped":
            lines.append(f"| {name} | " + " | ".join("n/a" for _ in cols)
                         + f" | skipped: {sysres['reason']} |")
            continue
        cat = sysres["cat_cold"].get("samples_per_s")
        mbs = sysres["cat_cold"].get("mb_per_s")
        lines.append(f"| {name} | " + " | ".join(_cell(ds, c, name) for c in cols)
                     + f" | {_num(cat)} ({_num(mbs)} MB/s) |")
    return lines


def detail_table(ds: dict[str, Any]) -> list[str]:
    """Pack, size, first batch, memory, shuffle quality, exactly-once, files opened."""
    lines = ["| system | pack files/s | output MB | first batch s (w0 / w2, warm) "
             "| peak RSS MB, w2 (anon) | shuffle quality w0 / w2 | exactly once, 2 epochs "
             "| files opened / epoch (1st, 2nd) | MB/s raw w0 warm |",
             "|---" * 9 + "|"]
    for name in _systems(ds):
        s = ds["systems"][name]
        if s["status"] != "ok":
            lines.append(f"| {name} | {s['status']}: {s['reason']} |" + " |" * 7)
            continue
        e = s["epochs"]
        w0, w2 = e.get("raw-w0-warm", {}), e.get("raw-w2-warm", {})
        audit = s.get("audit") or {}
        exact = audit.get("exactly_once")
        opens = audit.get("opens")
        lines.append(" | ".join([
            f"| {name}",
            "-" if name == BASELINE else _cell(ds, "pack", name),
            "-" if name == BASELINE else _num((s["pack"].get("output_bytes") or 0) / 1e6),
            f"{_num(w0.get('first_batch_s'), 2)} / {_num(w2.get('first_batch_s'), 2)}",
            f"{_num(w2.get('peak_rss_mb'))} ({_num(w2.get('peak_anon_mb'))})",
            f"{_num(w0.get('shuffle_quality'), 2)} / {_num(w2.get('shuffle_quality'), 2)}",
            "failed: " + str(audit.get("error"))[:60] if "error" in audit
            else ("yes" if exact and all(exact) else f"NO {exact}"),
            ", ".join(f"{o['opens']:,}" for o in opens) if opens else "-",
            _num(w0.get("mb_per_s")),
        ]) + " |")
    return lines


def first_sample_table(first: dict[str, Any]) -> list[str]:
    """Seconds from building the dataset and loader to the first batch, warm, 0 workers."""
    lines = [f"Time to the first batch of 64 on the tiny tree of {first['num_samples']:,} "
             "samples, warm, 0 workers, from building the dataset and loader (median):", "",
             "| system | first batch s | fastest peer's s / own |", "|---|---|---|"]
    for name in SYSTEMS:
        s = first["systems"].get(name)
        if s is None:
            continue
        ratio = "" if s["best_peer"] in (None, name) else (
            f"{_num(s['best_peer_s_over_own'], 2)} ({s['best_peer']})")
        value = s.get("first_batch_s")
        lines.append(f"| {name} | {_num(value, 3) if value else 'failed'} | {ratio} |")
    return lines


def issue_29(target: dict[str, Any]) -> bool:
    """Whether a target row is one issue 29 added: a new tree, a new row or a new target."""
    return (target["dataset"] not in ("images", "tiny") or target["target"] in ISSUE_29
            or target["system"] == "shardio-records-dataloader")


def targets_table(results: dict[str, Any],
                  keep: Callable[[dict[str, Any]], bool] | None = None) -> list[str]:
    """Issue 4's targets for shardio (those ``keep`` keeps): value, threshold, met."""
    lines = ["| tree | system | target | value | needs | met | note |", "|---" * 7 + "|"]
    mark = {True: "yes", False: "**NO**", None: "not measured"}
    for t in filter(keep, results["targets"]):
        lines.append(f"| {t['dataset']} | {t['system']} | {t['target']} | {_num(t['value'], 2)} "
                     f"| >= {t['threshold']} | {mark[t['met']]} | {t['note']} |")
    return lines


def render(results: dict[str, Any], *, level: str = "###",
           keep: Callable[[dict[str, Any]], bool] | None = None) -> str:
    """The whole generated block: provenance, per-tree tables, targets (``level``: headings;
    ``keep``: which target rows)."""
    m = results["machine"]
    disk = m.get("disk", {})
    versions = ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v)
    src = results.get("shardio_source") or {}
    source = (f" shardio source: git {src.get('git_head')}"
              f"{' plus uncommitted changes' if src.get('dirty') else ''}, package hash "
              f"{src.get('sha256')} (copied at the start; every measurement imported that copy)."
              if src else " shardio source: not recorded (the run predates source pinning).")
    out = [
        f"Measured {results['date']} with `{results['command']}` "
        f"({'quick' if results['quick'] else 'full'} run, median of {results['repeats']} "
        f"repeat(s), {results['wall_s'] / 60:.0f} min in all{_load(results)}).",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, disk "
        f"{disk.get('device', '?')} ({disk.get('fs', '?')}, "
        f"{'rotational' if disk.get('rotational') else 'non-rotational'} as the kernel reports "
        f"it), Python {m['python']}. Versions: {versions}." + source,
    ]
    for kind, ds in results["datasets"].items():
        ev = ds["eviction"]
        dl = ds.get("decode_limit") or {}
        out += ["", f"{level} {kind}: {ds['num_files']:,} samples, {ds['num_bytes'] / 1e6:,.0f} MB",
                "", "Epoch samples/s, batch size 64, shuffle on (median; x base = ratio to the "
                "ImageFolder baseline, x peer = ratio to the fastest peer in that column):", ""]
        out += throughput_table(ds)
        out += ["", *detail_table(ds), ""]
        out.append(
            f"Eviction check: reading the baseline's files took {_num(ev.get('cold_s'), 2)} s "
            f"cold and {_num(ev.get('warm_s'), 2)} s warm ({_num(ev.get('cold_over_warm_s'), 1)}x);"
            f" fincore: {_num(100 * (ev.get('resident_after_evict') or 0), 1)}% resident after "
            f"eviction. `tar -cf` of the tree: {_num(ds['tar'].get('files_per_s'))} files/s."
            + (f" Decode limit (Pillow, bytes in memory, no loader): "
               f"{_num(dl.get('per_core_samples_per_s'))} images/s in one process, "
               f"{_num(dl.get('two_core_samples_per_s'))} in two "
               + ("decoding at once." if "processes_samples_per_s" in dl
                  else "(twice one process's rate).") if dl else ""))
    if "first_sample" in results:
        out += ["", f"{level} Time to the first sample", "",
                *first_sample_table(results["first_sample"])]
    out += ["", f"{level} shardio against the targets of issues 4 and 29", "",
            *targets_table(results, keep)]
    return "\n".join(out)


def tables_block() -> str:
    """The ``bench-tables`` block of ``benchmarks/README.md``: the latest committed full run,
    then the latest run of every data shape (``*-quick-shapes.json``), where there is one."""
    text = render(json.loads(latest_full_run().read_text(encoding="utf-8")))
    shapes = sorted(RESULTS.glob("*-quick-shapes.json"))
    if not shapes:
        return text
    return "\n".join([text, "", f"### Every data shape (`results/{shapes[-1].name}`)", "",
                      "Its targets table keeps the rows issue 29 added: the new trees, random "
                      "access, the checksums' share, the LMDB file, the plain DataLoader and "
                      "the first sample.", "",
                      render(json.loads(shapes[-1].read_text(encoding="utf-8")), level="####",
                             keep=issue_29)])


def main(argv: list[str] | None = None) -> None:
    """Print the tables of a results file, or rewrite the READMEs' generated blocks."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, nargs="?")
    p.add_argument("--update-readme", action="store_true",
                   help="rewrite every generated block from the committed results")
    args = p.parse_args(argv)
    if args.update_readme:
        for document in write_blocks():
            print(f"rewrote {document}")
    elif args.results is None:
        p.error("give a results file, or --update-readme")
    else:
        print(render(json.loads(args.results.read_text(encoding="utf-8"))))



def _load(results: dict[str, Any]) -> str:
    """The 1-minute load average at the run's start and end, where the file has it."""
    load = results.get("load_avg_1min")
    if not load:
        return ""
    return (f"; 1-minute load average {load['start']:.1f} at the start, {load['end']:.1f} at "
            f"the end, median {load['median']:.1f} and at most {load['max']:.1f} before its "
            "measurements, the harness's own children included")


if __name__ == "__main__":
    main()
