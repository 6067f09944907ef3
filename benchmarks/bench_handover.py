"""Question: what does handing batches from DataLoader workers to the main process cost?

``shardio.loader`` with 2 workers against one process, in the same rounds: raw batches
(``RecordBatch``) of both trees and decoded images, each handed over through the
workers' shared-memory rings (``shardio.torch.handover.ring``, the default) and as pickled copies
(the ring turned off, how batches crossed before), raw batches also copied into the
ring (``-slots``: before they crossed as places in their shard files); decoded images
also through the per-sample path (``decode_tensor`` per image, then ``collate_tensor``),
and the decode limit (Pillow, 2 processes decoding the same in-memory JPEGs at once, no
loader). Each measurement is a fresh process timing one epoch from building the loader, like
``run.py``; it records samples/s and the CPU seconds per sample of the main process (with
what it spent before the first batch and in garbage collections) and of the workers, so
a ratio comes with where the time went, then the rate of a second
epoch through the same loader (workers already running). Median of ``--repeats``
rounds, the variants rotated from round to round; the 1-minute load average is kept
with every run. Writes ``benchmarks/results/handover.json`` (``--quick``: ``-quick``).

    benchmarks/.env/bin/python -m benchmarks.bench_handover [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.datagen import FULL_SIZES, QUICK_SIZES, Tree, ensure_tree
from benchmarks.resultsfile import RESULTS, load_results, write_results

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "handover"
BATCH = 64
VARIANTS = {
    # name: (tree, decode, num_workers, ring, path)
    "raw-images-w0": ("images", False, 0, True, "batch"),
    "raw-images-w2-copy": ("images", False, 2, False, "batch"),
    "raw-images-w2-ring": ("images", False, 2, True, "batch"),
    "raw-images-w2-slots": ("images", False, 2, True, "batch"),
    "raw-tiny-w0": ("tiny", False, 0, True, "batch"),
    "raw-tiny-w2-copy": ("tiny", False, 2, False, "batch"),
    "raw-tiny-w2-ring": ("tiny", False, 2, True, "batch"),
    "raw-tiny-w2-slots": ("tiny", False, 2, True, "batch"),
    "decoded-w2-per-sample-copy": ("images", True, 2, False, "per-sample"),
    "decoded-w2-per-sample-ring": ("images", True, 2, True, "per-sample"),
    "decoded-w2-ring": ("images", True, 2, True, "batch"),
}


def worker_cpu_s() -> float:
    """User + system CPU seconds of this process's live children (the DataLoader workers)."""
    import multiprocessing

    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for child in multiprocessing.active_children():
        try:
            with open(f"/proc/{child.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError):
            pass
    return total


def run_variant(name: str, pack: Path, tree: Tree) -> dict[str, Any]:
    """One epoch of ``name`` in this (fresh) process."""
    import shardio
    import shardio.torch.handover.ring
    from shardio.torch.collate import collate_tensor

    kind, decode, workers, ring, path = VARIANTS[name]
    shardio.torch.handover.ring.ENABLED = ring
    # "-ring": the default, local shards' raw batches as places in their files; "-slots":
    # every batch copied into the worker's ring, as before those
    shardio.torch.handover.ring.FILES_ENABLED = not name.endswith("-slots")
    # imported before the clock, like benchmarks.child's preload: shardio's lazy
    # attributes import its torch modules (35 ms here), which in a 0.1 s epoch added the
    # same constant to both sides of a ratio and pulled it towards 1
    _ = (shardio.StreamingDataset, shardio.loader)
    field = "image" if kind == "images" else "bin"
    collecting = [0.0, 0.0]  # the main process's garbage collections: CPU s, start of one

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            collecting[1] = time.thread_time()
        else:
            collecting[0] += time.thread_time() - collecting[1]

    gc.callbacks.append(on_gc)  # fork copies it: the workers' collections are in their own
    start, cpu = time.perf_counter(), time.process_time()
    dataset = shardio.StreamingDataset(pack, decode="tensor" if decode else "raw", seed=0)
    collate = collate_tensor if path == "per-sample" else None
    loader = shardio.loader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=collate)
    samples = nbytes = 0
    first: tuple[float, int] | None = None
    for batch in loader:  # the timed epoch
        if first is None:  # steady state from here: loader built, workers started
            first = (time.process_time(), 0)
        if decode:
            images, labels = batch
            images = list(images)
            labels.tolist()
            nbytes += sum(int(i.numel()) for i in images)
            samples += len(images)
        else:
            views = batch.bytes(field)
            if batch.labels is not None:
                batch.labels.tolist()
            else:
                [tree.label_of(key) for key in batch.keys]
            nbytes += sum(v.nbytes for v in views)
            samples += len(views)
        if first[1] == 0:
            first = (first[0], samples)
    seconds = time.perf_counter() - start
    main_cpu, workers_cpu = time.process_time() - cpu, worker_cpu_s()  # the timed epoch
    main_gc = collecting[0]
    assert first is not None
    steady = (time.process_time() - first[0]) / max(1, samples - first[1]) * 1e6
    again = time.perf_counter()  # a second epoch through the same loader: workers running
    count = sum(len(batch[0]) if decode else len(batch) for batch in loader)
    second = count / (time.perf_counter() - again)
    return {"samples": samples, "bytes": nbytes, "seconds": seconds,
            "samples_per_s": samples / seconds, "main_cpu_us": main_cpu / samples * 1e6,
            "main_cpu_steady_us": steady, "second_epoch_samples_per_s": second,
            # of main_cpu_us: until the first batch (workers started), and in collections
            # (a full one of what the imports left, about 40 ms here, whichever call triggers it)
            "main_cpu_start_ms": (first[0] - cpu) * 1e3, "main_gc_ms": main_gc * 1e3,
            "workers_cpu_us": workers_cpu / samples * 1e6, "load_1min": os.getloadavg()[0],
            "jpeg_decoder": shardio.decode.image.jpeg_decoder() if decode else None}


def run_limit(tree: Tree) -> dict[str, Any]:
    """The decode limit of ``benchmarks.child`` (one process, then 2 at once)."""
    from benchmarks.child import run_decode

    return {**run_decode(tree, {}), "load_1min": os.getloadavg()[0]}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    t = spec["tree"]
    tree = Tree(t["kind"], Path(t["root"]), t["num_files"], t["num_bytes"], t["num_classes"])
    """One measurement, in this process (``--child``)."""
    if spec["variant"] == "decode-limit":
        return run_limit(tree)
    return run_variant(spec["variant"], Path(spec["pack"]), tree)


def ensure_pack(tree: Tree) -> Path:
    """The tree packed once with the defaults (shuffled, zstd where it pays)."""
    out = WORK / tree.root.name
    if not (out / "manifest.json").exists():
        import shardio

        shardio.pack(tree.root, out, seed=0, num_workers=2, overwrite=True, progress=False)
    return out


def measure(variant: str, tree: Tree, pack: Path) -> dict[str, Any]:
    spec = {"variant": variant, "pack": str(pack),
            "tree": {"kind": tree.kind, "root": str(tree.root), "num_files": tree.num_files,
                     "num_bytes": tree.num_bytes, "num_classes": tree.num_classes}}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_handover", "--child",
                           json.dumps(spec)], capture_output=True, text=True, check=False,
                          cwd=HERE.parent, timeout=900)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def load_range(runs: dict[str, list[dict[str, Any]]]) -> str:
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
    """The README block: samples/s and CPU per sample of each hand-over, and their ratios."""
    name = next(f"{stem}.json" for stem in ("handover", "handover-quick")
                if (RESULTS / f"{stem}.json").exists())
    res = load_results(name)
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
        cells = [label, num(get(base, rate)), num(get(copy, rate)), num(get(ring, rate)),
                 f"**{_round_ratio(runs, (ring, rate), (base, rate))}** "
                 f"({_round_ratio(runs, (ring, again), (base, again))})",
                 _round_ratio(runs, (ring, rate), (copy, rate)),
                 f"{num(get(copy, 'main_cpu_steady_us'), 1)} / "
                 f"{num(get(ring, 'main_cpu_steady_us'), 1)}",
                 f"{num(get(base, 'main_cpu_us'), 1)} / {num(get(ring, 'workers_cpu_us'), 1)}"]
        rows.append("| " + " | ".join(cells) + " |")
    limit = ("decode-limit", "processes_samples_per_s")
    decoded, before = ("decoded-w2-ring", rate), ("decoded-w2-per-sample-copy", rate)
    cells = ["images, decoded (Pillow)", f"limit: {num(get(*limit))}",
             f"{num(get(*before))} (per sample)", num(get(*decoded)),
             f"**{_round_ratio(runs, decoded, limit)}** of the limit",
             _round_ratio(runs, decoded, before),
             f"{num(get('decoded-w2-per-sample-copy', 'main_cpu_steady_us'), 1)} / "
             f"{num(get('decoded-w2-ring', 'main_cpu_steady_us'), 1)}",
             f"- / {num(get('decoded-w2-ring', 'workers_cpu_us'), 1)}"]
    rows.append("| " + " | ".join(cells) + " |")
    trees = res["trees"]
    src = res.get("shardio_source", {})
    start = [f"{label} {num(get(ring, 'main_cpu_start_ms'))} ms ({num(get(ring, 'main_gc_ms'))} "
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
        f"during the runs: {load_range(res['runs'])} (2 cores, shared with other jobs).",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small trees, 1 repeat")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--variants", default=",".join([*VARIANTS, "decode-limit"]))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    repeats = args.repeats or (1 if args.quick else 3)
    trees = {kind: ensure_tree(kind, sizes[kind]) for kind in ("images", "tiny")}
    packs = {kind: ensure_pack(tree) for kind, tree in trees.items()}
    names = args.variants.split(",")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    started = time.time()
    for rep in range(repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            kind = "images" if name == "decode-limit" else VARIANTS[name][0]
            runs[name].append(measure(name, trees[kind], packs[kind]))
            brief = {k: round(v, 2) for k, v in runs[name][-1].items() if isinstance(v, float)}
            print(f"round {rep + 1}/{repeats} {name}: {brief}", flush=True)
    medians = {name: {key: statistics.median(r[key] for r in rs if key in r)
                      for key in rs[0] if isinstance(rs[0][key], (int, float))}
               for name, rs in runs.items() if rs and "error" not in rs[0]}
    out = write_results(f"handover{'-quick' if args.quick else ''}.json", {
        "question": __doc__.splitlines()[0], "repeats": repeats, "batch_size": BATCH,
        "wall_s": round(time.time() - started, 1),
        "trees": {k: {"files": t.num_files, "bytes": t.num_bytes} for k, t in trees.items()},
        "medians": medians, "runs": runs,
    }, command="benchmarks/.env/bin/python -m benchmarks.bench_handover"
       + (" --quick" if args.quick else ""), sort_keys=True)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
