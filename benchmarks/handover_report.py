"""The ``bench-handover`` and ``bench-decode`` blocks of ``benchmarks/README.md``.

Rendered from the committed ``results/handover.json`` (``bench_handover.py``) and
``results/decode.json`` (``bench_decode.py``); a quick run's file is used when no full
one is committed. Every ratio compares figures of the same run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> tuple[dict[str, Any], str]:
    for candidate in (f"{name}.json", f"{name}-quick.json"):
        path = RESULTS / candidate
        if path.exists():
            return json.loads(path.read_text(encoding="utf-8")), candidate
    raise FileNotFoundError(f"benchmarks/results/{name}.json: run the benchmark first")


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _load_range(runs: dict[str, list[dict[str, Any]]]) -> str:
    loads = [r["load_1min"] for rs in runs.values() for r in rs if "load_1min" in r]
    if not loads:
        return "not recorded"
    return f"median {statistics.median(loads):.1f} ({min(loads):.1f}-{max(loads):.1f})"


def _round_ratio(runs: dict[str, list[dict[str, Any]]], a: tuple[str, str],
                 b: tuple[str, str]) -> str:
    """Median over rounds of ``a / b``, each ``(variant, key)`` taken in the same round."""
    pairs = zip(runs.get(a[0], []), runs.get(b[0], []), strict=False)
    ratios = [x[a[1]] / y[b[1]] for x, y in pairs if a[1] in x and y.get(b[1])]
    return f"{statistics.median(ratios):.2f}" if ratios else "-"


def handover_block() -> str:
    """Samples/s and CPU per sample of each hand-over, with the ratios issue 10 asks for."""
    res, name = _load("handover")
    med, runs = res["medians"], res["runs"]
    rate = "samples_per_s"

    def get(variant: str, key: str) -> float | None:
        value = med.get(variant, {}).get(key)
        return None if value is None else float(value)

    rows = []
    for label, base, copy, ring in (
        ("images, raw", "raw-images-w0", "raw-images-w2-copy", "raw-images-w2-ring"),
        ("tiny, raw", "raw-tiny-w0", "raw-tiny-w2-copy", "raw-tiny-w2-ring"),
    ):
        again = "second_epoch_samples_per_s"
        cells = [label, _num(get(base, rate)), _num(get(copy, rate)), _num(get(ring, rate)),
                 f"**{_round_ratio(runs, (ring, rate), (base, rate))}** "
                 f"({_round_ratio(runs, (ring, again), (base, again))})",
                 _round_ratio(runs, (ring, rate), (copy, rate)),
                 f"{_num(get(copy, 'main_cpu_steady_us'), 1)} / "
                 f"{_num(get(ring, 'main_cpu_steady_us'), 1)}",
                 f"{_num(get(base, 'main_cpu_us'), 1)} / {_num(get(ring, 'workers_cpu_us'), 1)}"]
        rows.append("| " + " | ".join(cells) + " |")
    limit = ("decode-limit", "processes_samples_per_s")
    ring, before = ("decoded-w2-ring", rate), ("decoded-w2-per-sample-copy", rate)
    cells = ["images, decoded (Pillow)", f"limit: {_num(get(*limit))}",
             f"{_num(get(*before))} (per sample)", _num(get(*ring)),
             f"**{_round_ratio(runs, ring, limit)}** of the limit",
             _round_ratio(runs, ring, before),
             f"{_num(get('decoded-w2-per-sample-copy', 'main_cpu_steady_us'), 1)} / "
             f"{_num(get('decoded-w2-ring', 'main_cpu_steady_us'), 1)}",
             f"- / {_num(get('decoded-w2-ring', 'workers_cpu_us'), 1)}"]
    rows.append("| " + " | ".join(cells) + " |")
    trees = res["trees"]
    src = res.get("shardio_source", {})
    start = [f"{label} {_num(get(ring, 'main_cpu_start_ms'))} ms ({_num(get(ring, 'main_gc_ms'))} "
             "ms of it in garbage collections)"
             for label, ring in (("images", "raw-images-w2-ring"), ("tiny", "raw-tiny-w2-ring"))
             if get(ring, "main_cpu_start_ms") is not None]
    return "\n".join([
        f"Run of {res['date']} (`benchmarks/results/{name}`, `{res['command']}`): medians of "
        f"{res['repeats']} rotated round(s), ratios the median of each round's ratio; batch "
        f"size {res['batch_size']}, each figure one epoch in a fresh process from building "
        f"the loader; images {trees['images']['files']:,}"
        f" JPEGs, tiny {trees['tiny']['files']:,} files; shardio at {src.get('git_head')}"
        f"{' (+ uncommitted changes)' if src.get('dirty') else ''}. 1-minute load average "
        f"during the runs: {_load_range(res['runs'])} (2 cores, shared with other jobs).",
        "",
        "| batches | 1 process, samples/s | 2 workers, pickled copies | 2 workers, shared-memory "
        "ring | ring / 1 process (second epoch) | ring / copies | main-process CPU "
        "us/sample, copies / ring | CPU us/sample: 1 process / 2 workers' |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        *(["", "The main-process columns are steady epochs (from the first batch on). Before "
            "its first batch, the main process of a 2-worker raw run spent "
            + " and ".join(start) + " of CPU: the plan's first stage, starting the workers, "
            "and, in every fresh process, one full collection of the objects the imports "
            "left, wherever it falls (the 1-process runs pay it too)."] if start else []),
    ])


def decode_block() -> str:
    """Per decoder: its limit, and shardio's decoded epoch against the limit of the same decoder."""
    res, name = _load("decode")
    med, ratios = res["medians"], res["loader_over_same_decoder_limit"]
    versions = res["decoder_versions"]
    rows = []
    for decoder in ("pillow", "pillow-simd", "simplejpeg", "pyturbojpeg"):
        lim = med.get(f"limit:{decoder}")
        if lim is None:
            continue
        loader = med.get(f"loader:{decoder}", {})
        rows.append(
            f"| {decoder} {versions.get(decoder) or ''} | {_num(lim.get('us_per_image'))} | "
            f"{_num(lim.get('one_process_per_s'))} | {_num(lim.get('two_processes_per_s'))} | "
            f"{_num(loader.get('samples_per_s'))} | "
            f"{'**' + format(ratios[decoder], '.2f') + '**' if decoder in ratios else '-'} |")
    return "\n".join([
        f"Run of {res['date']} (`benchmarks/results/{name}`, `{res['command']}`): median of "
        f"{res['repeats']} rotated round(s), {res['images']:,} images (limits: 2,000 of them, "
        f"bytes in memory, no loader). 1-minute load average during the runs: "
        f"{_load_range(res['runs'])}.",
        "",
        "| decoder | us/image, 1 process | images/s, 1 process | images/s, 2 processes at once "
        "(the limit) | shardio.loader decoded, 2 workers | / limit of the same decoder |",
        "|---|---|---|---|---|---|",
        *rows,
    ])
