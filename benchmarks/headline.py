"""The README's benchmark summary: one table and the target verdicts of the latest full run.

Rendered from ``benchmarks/results/<date>-full.json`` (the newest by name) for the
``bench-summary`` block of ``README.md`` (see ``benchmarks/readme.py``); the full tables
are in ``benchmarks/README.md``. Figures are rounded to three significant digits: on a
shared machine the repeats of one figure differ by more than that.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.readme import RESULTS

BASELINE = "imagefolder"
SHARDIO = "shardio-records"
UNSHUFFLED = "shardio-records-unshuffled"
PEERS = ("webdataset", "mosaicml", "litdata", "lmdb-file")
NAMES = {"webdataset": "WebDataset", "mosaicml": "MosaicML", "litdata": "LitData",
         "lmdb-file": "LMDB", BASELINE: "ImageFolder"}
EPOCHS = {  # column of the results -> how the row says it
    "raw-w0-cold": "cold, 1 process",
    "raw-w2-cold": "cold, 2 workers",
    "raw-w0-warm": "warm, 1 process",
    "raw-w2-warm": "warm, 2 workers",
    "decoded-w2-warm": "decoded, 2 workers",
}


def latest_full_run(results: Path = RESULTS) -> Path:
    """The newest committed full run (file names start with the ISO date).

    Raises:
        FileNotFoundError: no ``*-full.json`` in ``results``.
    """
    runs = sorted(results.glob("*-full.json"))
    if not runs:
        raise FileNotFoundError(f"{results}: no *-full.json; run python -m benchmarks.run")
    return runs[-1]


def sig(value: float | None, digits: int = 3) -> str:
    """``value`` rounded to ``digits`` significant digits, with thousands separators."""
    if value is None or math.isnan(value):
        return "–"
    if value == 0:
        return "0"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))  # negative: round to tens, …
    return f"{round(value, decimals):,.{max(decimals, 0)}f}"


def _times(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}×" if value < 10 else f"{value:.1f}×"


def _tree(kind: str, ds: dict[str, Any]) -> str:
    mean_kb = ds["num_bytes"] / ds["num_files"] / 1e3
    noun = "JPEGs" if kind == "images" else "files"
    return f"{ds['num_files']:,} {noun} of {sig(mean_kb, 2)} KB"


def _epoch_row(kind: str, ds: dict[str, Any], metric: str) -> str:
    ratios = ds["ratios"][metric]
    base = ratios.get(BASELINE, {}).get("value")
    own = ratios.get(SHARDIO)
    best = next(iter(ratios.values()))["best_peer"] if ratios else None
    peer = f"{sig(ratios[best]['value'])} ({NAMES[best]})" if best in ratios else "–"
    mine = "–" if own is None else (
        f"{sig(own['value'])} ({_times(own['vs_baseline'])} baseline, "
        f"{_times(own['vs_best_peer'])} {NAMES.get(str(best), '–')})")
    return f"| {_tree(kind, ds)}, {EPOCHS[metric]} | {sig(base)} | {peer} | {mine} |"


def _quality(system: dict[str, Any]) -> float | None:
    value = system.get("epochs", {}).get("raw-w0-warm", {}).get("shuffle_quality")
    return value if isinstance(value, float | int) else None


def _shuffle_row(kind: str, ds: dict[str, Any]) -> str:
    systems = ds["systems"]
    peers = {n: _quality(systems[n]) for n in PEERS if n in systems}
    worst = sorted((q, n) for n, q in peers.items() if q is not None)
    peer = ", ".join(f"{NAMES[n]} {q:.2f}" for q, n in worst[:2]) if worst else "–"
    own, unshuffled = _quality(systems.get(SHARDIO, {})), _quality(systems.get(UNSHUFFLED, {}))
    mine = f"{own:.2f}" if own is not None else "–"
    if unshuffled is not None:
        mine += f"; {unshuffled:.2f} from a class-ordered `--no-shuffle` pack"
    base = _quality(systems.get(BASELINE, {}))
    return (f"| shuffle quality, {_tree(kind, ds)} (1.00 = a perfect shuffle) "
            f"| {'–' if base is None else f'{base:.2f}'} | lowest: {peer} | {mine} |")


def _opens(system: dict[str, Any]) -> int | None:
    opens = (system.get("audit") or {}).get("opens")
    return int(opens[0]["opens"]) if opens else None


def _opens_row(kind: str, ds: dict[str, Any]) -> str:
    systems = ds["systems"]
    peers = sorted((o, n) for n in PEERS if n in systems and (o := _opens(systems[n])))
    peer = f"{peers[0][0]:,} ({NAMES[peers[0][1]]})" if peers else "–"
    base, own = _opens(systems.get(BASELINE, {})), _opens(systems.get(SHARDIO, {}))
    return (f"| files opened in the first epoch, {_tree(kind, ds)} | "
            f"{'–' if base is None else f'{base:,}'} | fewest: {peer} | "
            f"{'–' if own is None else f'{own:,}'} |")


def _pack_row(kind: str, ds: dict[str, Any]) -> str:
    ratios = ds["ratios"].get("pack", {})
    own = ratios.get(SHARDIO)
    best = own["best_peer"] if own else None
    tar = ds["tar"].get("files_per_s")
    sizes = {n: ds["systems"][n]["pack"].get("output_bytes") for n in PEERS
             if n in ds["systems"] and ds["systems"][n]["status"] == "ok"}
    sizes = {n: b for n, b in sizes.items() if b}
    smallest = min(sizes, key=lambda n: sizes[n]) if sizes else None
    peer = f"{sig(ratios[best]['value'])} ({NAMES[best]})" if best in ratios else "–"
    if smallest:
        peer += f"; smallest output {sig(sizes[smallest] / 1e6)} MB ({NAMES[smallest]})"
    mine = "–"
    if own:
        out_mb = ds["systems"][SHARDIO]["pack"]["output_bytes"] / 1e6
        mine = (f"{sig(own['value'])} ({_times(own['vs_best_peer'])} {NAMES[str(best)]}, "
                f"{_times(own['value'] / tar if tar else None)} `tar -cf`); "
                f"output {sig(out_mb)} MB")
    return (f"| pack, files/s, {_tree(kind, ds)} ({sig(ds['num_bytes'] / 1e6)} MB in) "
            f"| – | {peer} | {mine} |")


def _targets(results: dict[str, Any]) -> list[str]:
    met, missed, unmeasured = [], [], []
    for t in results["targets"]:
        if t["system"] != SHARDIO:
            continue
        what = f"{t['dataset']}: {t['target']}"
        if t["met"] is None:
            unmeasured.append(what)
        elif t["met"]:
            met.append(f"{what} ({sig(t['value'])}, needs ≥ {t['threshold']})")
        else:
            missed.append(f"{what} ({sig(t['value'])}, needs ≥ {t['threshold']})")
    return [
        f"Issue 4's targets for `{SHARDIO}` in this run (`benchmarks/summary.py` checks them): "
        f"{len(met)} met, {len(missed)} missed, {len(unmeasured)} not measured by this harness.",
        "",
        *(f"* met — {line}" for line in met),
        *(f"* **missed** — {line}" for line in missed),
    ]


def render_summary(results: dict[str, Any], *, source: str) -> str:
    """The summary block for one results document; ``source`` names its file."""
    m = results["machine"]
    out = [
        f"Full run of {results['date']} (`{source}`), {m['cores']} cores ({m['cpu']}), "
        f"{m['ram_gib']} GiB RAM: samples/s, batch size {results['config']['batch_size']}, "
        f"median of {results['repeats']}; *cold* = every data file evicted from the page "
        "cache first; ratios compare figures of the same run.",
        "",
        "| | baseline (ImageFolder) | best peer | shardio (records) |",
        "|---|---|---|---|",
    ]
    datasets = results["datasets"]
    for kind in ("tiny", "images"):
        if kind in datasets:
            out += [_epoch_row(kind, datasets[kind], metric) for metric in EPOCHS
                    if metric in datasets[kind]["ratios"]]
    for kind, ds in datasets.items():
        out.append(_shuffle_row(kind, ds))
    for kind, ds in datasets.items():
        out.append(_opens_row(kind, ds))
    for kind, ds in datasets.items():
        out.append(_pack_row(kind, ds))
    return "\n".join([*out, "", *_targets(results)])


def summary_block() -> str:
    """The ``bench-summary`` block of README.md, from the latest committed full run."""
    path = latest_full_run()
    results = json.loads(path.read_text(encoding="utf-8"))
    return render_summary(results, source=path.relative_to(RESULTS.parent.parent).as_posix())
