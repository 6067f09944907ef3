"""The README's one headline table: samples/s of shardio and the peers it replaces.

A few columns of the newest committed full run (``benchmarks/results/<date>-full.json``),
every peer on each row, so that the columns where a peer wins are shown too; the Performance
page of the docs (``benchmarks/performance.py``) has every column, system and figure.
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks.headline import latest_full_run, sig
from benchmarks.performance import COLUMNS, NAMES, TREES
from benchmarks.readme import REPO

SYSTEMS = ("imagefolder", "webdataset", "mosaicml", "litdata", "lmdb-file", "shardio-records")
"""The baseline, the peers and shardio's default: the systems a newcomer chooses between."""
CELLS = (("tiny", "raw-w0-cold"), ("tiny", "raw-w0-warm"), ("images", "raw-w0-cold"),
         ("images", "raw-w0-warm"), ("images", "decoded-w2-warm"))
"""(tree, epoch) of each column: reading from disk and from memory, and decoded training."""


def _size(tree: str, ds: dict[str, Any]) -> str:
    mean_kb = sig(ds["num_bytes"] / ds["num_files"] / 1e3, 2)
    return f"{ds['num_files']:,} {TREES.get(tree, 'files')} of {mean_kb} KB"


def headline_block() -> str:
    """The ``readme-headline`` block of README.md, from the newest committed full run."""
    path = latest_full_run()
    results = json.loads(path.read_text(encoding="utf-8"))
    datasets = results["datasets"]
    cells = [(tree, epoch) for tree, epoch in CELLS if epoch in datasets.get(tree, {})
             .get("ratios", {})]
    m = results["machine"]
    trees = "; ".join(f"*{tree}*: {_size(tree, datasets[tree])}" for tree in dict(cells))
    out = [f"Samples/s, full run of {results['date']} (`{path.relative_to(REPO).as_posix()}`) "
           f"on {m['cores']} cores ({m['cpu']}): batch size {results['config']['batch_size']}, "
           f"median of {results['repeats']}; {trees}. *Cold*: every data file evicted from the "
           "page cache first; *1 process*: `num_workers=0`.",
           "",
           "| system | " + " | ".join(f"{tree}, {COLUMNS[epoch]}" for tree, epoch in cells) + " |",
           "|---" + "|---:" * len(cells) + "|"]
    for system in SYSTEMS:
        values = [datasets[tree]["ratios"][epoch].get(system, {}).get("value")
                  for tree, epoch in cells]
        out.append(f"| {NAMES[system]} | " + " | ".join(sig(v) for v in values) + " |")
    return "\n".join(out)
