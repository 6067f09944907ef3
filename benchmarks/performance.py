"""The docs' Performance page: samples/s per system and per worker count, table and figures.

Both come from the newest committed full run of the harness (``benchmarks/run.py``,
``benchmarks/results/<date>-full.json``): ``systems_block`` renders the generated block
``perf-systems`` of ``docs/performance.md`` (``benchmarks/readme.py`` fills it; ``remote_block``
fills ``perf-remote``) and
``draw_figures`` draws ``docs/img/perf-<tree>.png``, which the block shows.

    python -m benchmarks.performance      # redraw the figures, after a new full run
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.headline import latest_full_run, sig
from benchmarks.readme import REPO

IMAGES = REPO / "docs" / "img"
NAMES = {
    "imagefolder": "ImageFolder (baseline)",
    "webdataset": "WebDataset",
    "mosaicml": "MosaicML Streaming",
    "litdata": "LitData",
    "lmdb-file": "one LMDB file",
    "shardio-records": "shardio (records)",
    "shardio-lmdb": "shardio (LMDB shards)",
    "shardio-records-dataloader": "shardio, plain DataLoader",
    "shardio-records-unshuffled": "shardio, --no-shuffle pack",
}
"""System of the results file -> its name on the page, in the page's order."""
COLUMNS = {
    "raw-w0-cold": "cold, 1 process",
    "raw-w2-cold": "cold, 2 workers",
    "raw-w0-warm": "warm, 1 process",
    "raw-w2-warm": "warm, 2 workers",
    "decoded-w2-warm": "decoded, 2 workers",
}
"""Epoch of the results file -> its column."""
TREES = {"images": "JPEGs", "tiny": "small files"}
COLOURS = ((70, 110, 190), (240, 150, 40))  # 1 process, 2 workers


def _run() -> tuple[dict[str, Any], str]:
    path = latest_full_run()
    return json.loads(path.read_text(encoding="utf-8")), path.relative_to(REPO).as_posix()


def _value(ds: dict[str, Any], epoch: str, system: str) -> float | None:
    row = ds["ratios"].get(epoch, {}).get(system)
    return None if row is None else float(row["value"])


def _tree(kind: str, ds: dict[str, Any]) -> str:
    mean_kb = ds["num_bytes"] / ds["num_files"] / 1e3
    return f"{ds['num_files']:,} {TREES.get(kind, 'files')} of {sig(mean_kb, 2)} KB"


def systems_block() -> str:
    """The ``perf-systems`` block: per tree, samples/s of every system in every epoch."""
    results, source = _run()
    m = results["machine"]
    out = [f"Full run of {results['date']} (`{source}`), {m['cores']} cores ({m['cpu']}), "
           f"{m['ram_gib']} GiB RAM; samples/s, batch size {results['config']['batch_size']}, "
           f"median of {results['repeats']}. *Cold*: every data file evicted from the page "
           "cache first; *raw*: the stored bytes, *decoded*: Pillow-decoded tensors; pack: "
           "files/s into the system's own format."]
    for kind, ds in results["datasets"].items():
        epochs = [e for e in COLUMNS if e in ds["ratios"]]
        out += ["", f"### {_tree(kind, ds)}", "",
                "| system | " + " | ".join(COLUMNS[e] for e in epochs) + " | pack |",
                "|---" + "|---:" * (len(epochs) + 1) + "|"]
        for system in NAMES:
            if system not in ds["systems"]:
                continue
            cells = [sig(_value(ds, e, system)) for e in [*epochs, "pack"]]
            out.append(f"| {NAMES[system]} | " + " | ".join(cells) + " |")
        out += ["", f"![samples/s per system, 1 process and 2 workers, {kind} tree]"
                    f"(img/perf-{kind}.png)"]
    return "\n".join(out)


def remote_block() -> str:
    """The ``perf-remote`` block: the main README's streaming-from-S3 summary, with its link
    to the benchmarks README (outside the site) named instead of linked."""
    from benchmarks.remote_report import summary_block

    return summary_block().replace(
        "[benchmarks/README.md](benchmarks/README.md#remote-reading-bench_remotepy)",
        '`benchmarks/README.md`, "Remote reading"')


def draw(kind: str, ds: dict[str, Any], date: str, path: Path) -> None:
    """A PNG: per system, raw samples/s in one process and with 2 workers, cold and warm."""
    from PIL import Image, ImageDraw, ImageFont

    systems = [s for s in NAMES if s in ds["systems"]]
    font = ImageFont.load_default(size=13)
    bold = ImageFont.load_default(size=15)
    width, label_w, bar_h, row_h, head = 900, 200, 11, 30, 28
    panels = ("cold", "warm")
    height = 50 + len(panels) * (head + row_h * len(systems)) + 30
    image = Image.new("RGB", (width, height), "white")
    draw_ = ImageDraw.Draw(image)
    draw_.text((10, 10), f"Raw samples/s, {_tree(kind, ds)} (run of {date})", fill="black",
               font=bold)
    y = 44
    for cache in panels:
        epochs = (f"raw-w0-{cache}", f"raw-w2-{cache}")
        top = max((_value(ds, e, s) or 0.0 for e in epochs for s in systems), default=0.0) or 1
        draw_.text((10, y), f"{cache} page cache", fill="black", font=bold)
        y += head
        for system in systems:
            draw_.text((10, y + 4), NAMES[system], fill="black", font=font)
            for i, epoch in enumerate(epochs):
                value = _value(ds, epoch, system)
                y0 = y + i * (bar_h + 1)
                if value is None:
                    draw_.text((label_w, y0 - 2), "not measured", fill="grey", font=font)
                    continue
                length = (width - label_w - 90) * value / top
                draw_.rectangle((label_w, y0, label_w + length, y0 + bar_h), fill=COLOURS[i])
                draw_.text((label_w + length + 4, y0 - 2), sig(value), fill="black", font=font)
            y += row_h
    for i, label in enumerate(("1 process (num_workers=0)", "2 DataLoader workers")):
        x = 10 + i * 260
        draw_.rectangle((x, height - 22, x + 14, height - 10), fill=COLOURS[i])
        draw_.text((x + 20, height - 24), label, fill="black", font=font)
    # a 16-colour palette keeps the committed PNG at a few tens of KB
    image.quantize(colors=16).save(path, format="PNG", optimize=True)


def draw_figures(out: Path = IMAGES) -> list[Path]:
    """Draw ``perf-<tree>.png`` of every tree of the newest full run; the files written."""
    results, _ = _run()
    written = []
    for kind, ds in results["datasets"].items():
        path = out / f"perf-{kind}.png"
        draw(kind, ds, results["date"], path)
        written.append(path)
    return written


if __name__ == "__main__":
    for figure in draw_figures():
        print(f"wrote {figure.relative_to(REPO)}")
