"""Question: what bounds a cold epoch of shardio in one process: the reader, or the disk
reading the epoch's blocks?

For each shared tree (``benchmarks/datagen.py``), packed with ``shardio.pack`` as the
harness packs it, in rounds that alternate the measurements, every shard file evicted
from the page cache before each cold one (``benchmarks.probe.evict``):

* ``cat``: every shard file read front to back in 128 KiB reads (the harness's cold
  ``cat`` column);
* ``blocks``: the epoch's own reads without the reader. The runs a warm epoch with the
  same seed hints (``stream.advise``, one call a window, in its order) are replayed: each
  shard's header and tail hinted when a window first names it (``advise_open``), the
  window's runs hinted (``posix_fadvise(WILLNEED)``) and then touched a page at a time
  through the shard's map, in order; then the next window;
* ``epoch``: ``StreamingDataset(decode="raw")`` read by ``shardio.loader`` with 0 workers,
  each batch's payloads taken as the harness takes them, the whole cold epoch and its
  first batch; ``warm epoch``: the same with every file cached.

So ``blocks / cat`` is what the epoch's block order costs the disk against one pass
front to back, and ``epoch / blocks`` what the reader adds on top of its own reads.
Writes ``benchmarks/results/cold.json``; the README table comes from it (``cold_block``).

    python -m benchmarks.bench_cold [--quick] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / "work" / "cold"
READ_BYTES = 128 << 10
"""``cat``'s read size, as the harness's cold ``cat`` reads."""


def _cat(paths: list[Path]) -> None:
    buffer = memoryview(bytearray(READ_BYTES))
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.readv(fd, [buffer]):
                pass
        finally:
            os.close(fd)


def record_hints(root: Path, seed: int) -> list[list[tuple[str, int, int]]]:
    """The byte spans a warm epoch of ``root`` hints, window by window, in its order:
    ``(shard file name, offset, length)``."""
    import shardio
    import shardio.reading.stream as stream

    windows: list[list[tuple[str, int, int]]] = []
    real = stream.advise

    def advise(reader: Any, runs: list[tuple[int, int, int]]) -> None:
        spans = []
        for shard, start, stop in runs:
            shard_reader = reader.shard(shard)
            lo = shard_reader.offset(start)
            spans.append((Path(shard_reader.path).name, lo, shard_reader.offset(stop) - lo))
        windows.append(spans)
        real(reader, runs)

    stream.advise = advise
    try:
        for _batch in shardio.loader(shardio.StreamingDataset(root, decode="raw", seed=seed),
                                     batch_size=64, num_workers=0):
            pass
    finally:
        stream.advise = real
    return windows


def _blocks(root: Path, windows: list[list[tuple[str, int, int]]]) -> None:
    import shardio
    from shardio.backends.records import advise_open

    manifest = shardio.read_manifest(root)
    shards = {info.name: info for info in manifest.shards}
    maps: dict[str, tuple[int, mmap.mmap]] = {}
    try:
        for spans in windows:
            for name, _lo, _n in spans:
                if name not in maps:
                    info = shards[name]
                    fd = advise_open(root / name, info.num_bytes, info.num_samples)
                    assert fd is not None, f"{root / name}: cannot be opened"
                    maps[name] = fd, mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            for name, lo, n in spans:
                os.posix_fadvise(maps[name][0], lo, n, os.POSIX_FADV_WILLNEED)
            for name, lo, n in spans:
                view = maps[name][1]
                for at in range(lo - lo % mmap.PAGESIZE, lo + n, mmap.PAGESIZE):
                    view[at]
    finally:
        for fd, view in maps.values():
            view.close()
            os.close(fd)


def _epoch(root: Path, field: str, seed: int) -> tuple[float, float]:
    """Seconds of one epoch from building the loader, and to its first batch."""
    import shardio

    start = time.perf_counter()
    first = None
    dataset = shardio.StreamingDataset(root, decode="raw", seed=seed)
    for batch in shardio.loader(dataset, batch_size=64, num_workers=0):
        if first is None:
            first = time.perf_counter() - start
        sum(view.nbytes for view in batch.bytes(field))
    return time.perf_counter() - start, first or 0.0


def measure(kind: str, num_files: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    """Seconds of each measurement for one shared tree, every round."""
    import shardio
    from benchmarks.datagen import ensure_tree

    tree = ensure_tree(kind, num_files, seed=0)
    root = WORK / f"{kind}-{num_files}"
    if not (root / "manifest.json").exists():
        shardio.pack(tree.root, root, seed=0, num_workers=2, overwrite=True,
                     class_folders=kind != "images")
    return measure_packed(root, "image" if kind == "images" else "bin", rounds, seed,
                          kind=kind)


def measure_packed(root: Path, field: str, rounds: int, seed: int = 0,
                   kind: str = "") -> dict[str, Any]:
    """Seconds of each measurement for the ``.rec`` dataset at ``root`` (payloads in
    ``field``), every round."""
    import shardio
    from benchmarks.probe import evict, read_all

    paths = sorted(root.glob("*.rec"))
    read_all(paths)
    windows = record_hints(root, seed)
    _epoch(root, field, seed)  # imports and first uses, outside every measurement
    times: dict[str, list[float]] = {"cat": [], "blocks": [], "epoch": [], "first batch": [],
                                     "warm epoch": []}
    for _ in range(rounds):
        for name in ("cat", "blocks", "epoch"):
            evict(paths)
            start = time.perf_counter()
            if name == "cat":
                _cat(paths)
            elif name == "blocks":
                _blocks(root, windows)
            else:
                seconds, first = _epoch(root, field, seed)
                times["first batch"].append(first)
            times[name].append(seconds if name == "epoch" else time.perf_counter() - start)
        read_all(paths)
        times["warm epoch"].append(_epoch(root, field, seed)[0])
    return {"kind": kind or root.name, "num_files": shardio.read_manifest(root).num_samples,
            "shards": len(paths), "bytes": sum(p.stat().st_size for p in paths),
            "seconds": times, "windows": len(windows), "spans": sum(map(len, windows))}


def main(argv: list[str] | None = None) -> Path:
    """Measure the trees; returns the results file."""
    from benchmarks.datagen import FULL_SIZES, QUICK_SIZES
    from benchmarks.machine import source_id
    from benchmarks.resultsfile import write_results

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small trees, 2 rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS / "cold.json")
    p.add_argument("--trees", default="images,tiny",
                   help=f"shared trees to measure, of {', '.join(FULL_SIZES)}")
    args = p.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    load = [os.getloadavg()[0]]
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    kinds = args.trees.split(",")
    trees = [measure(kind, sizes[kind], rounds) for kind in kinds]
    load.append(os.getloadavg()[0])
    command = "python -m benchmarks.bench_cold" + (" --quick" if args.quick
                                                    else f" --rounds {rounds}") + (
        "" if kinds == ["images", "tiny"] else f" --trees {args.trees}")
    write_results(args.out, {"git": source_id(RESULTS.parent.parent / "shardio")["git_head"],
                             "load_avg_1min": load, "trees": trees}, command=command)
    print(cold_block(args.out))
    return args.out


def cold_block(path: Path | None = None) -> str:
    """The README table of cold reads, from ``cold.json``."""
    results = json.loads((path or RESULTS / "cold.json").read_text(encoding="utf-8"))
    lines = [f"Measured {results['date']} (`{results['command']}`, shardio at git "
             f"{results['git']}), 1-minute load average {results['load_avg_1min'][0]:.1f} "
             f"before, {results['load_avg_1min'][1]:.1f} after; one process, seconds, median "
             "of the rounds (samples/s; x `cat`: `cat`'s seconds over these):", "",
             "| tree | shards | windows (runs hinted) | cold `cat` | cold blocks, no reader "
             "| cold epoch | first batch, cold | warm epoch | blocks / `cat` | cold epoch / "
             "blocks |", "|---|---|---|---|---|---|---|---|---|---|"]
    for tree in results["trees"]:
        median = {name: statistics.median(v) for name, v in tree["seconds"].items()}
        n = tree["num_files"]

        def cell(name: str, median: dict[str, float] = median, n: int = n) -> str:
            s = median[name]
            return f"{s:.3f} ({n / s:,.0f}; x{median['cat'] / s:.2f})"

        lines.append(
            f"| {tree['kind']} ({n:,}, {tree['bytes'] / 1e6:,.0f} MB) | {tree['shards']} | "
            f"{tree['windows']} ({tree['spans']:,}) | "
            f"{median['cat']:.3f} ({n / median['cat']:,.0f}) | "
            f"{cell('blocks')} | {cell('epoch')} | {median['first batch']:.3f} | "
            f"{cell('warm epoch')} | {median['blocks'] / median['cat']:.2f} | "
            f"{median['epoch'] / median['blocks']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
