"""Which bound on a v3 block's bytes? Random-access bytes read against per-sample decode cost.

For each block bound from 16 KiB to 1 MiB, the samples of both datagen trees (``tiny``:
1-4 KB files half noise, half pattern, with a label; ``images``: 60-110 KB JPEGs with a
label) are encoded into one v3 ``.rec`` shard in memory (zstd level 3 where it pays), then:

* ``random_bytes_per_access``: bytes of the block a random record's read must fetch and
  check (the mean, over records, of their block's stored size), against ``record_bytes``;
* ``random_us``: one random record read: its block's CRC-32C, head, columns inflated, the
  record's values cut (min of 5 rounds of 500 records);
* ``sequential_us_per_sample``: every block checked, inflated and cut into sample dicts,
  per sample (min of 5 rounds);
* ``stored_ratio``: shard bytes over the samples' value bytes.

Writes ``benchmarks/results/block_size.json``. Usage:
``python -m benchmarks.bench_block_size [--tiny N] [--images N]``.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.datagen import ensure_tree
from shardio.format.block import check_block, decode_block, decode_columns, read_head
from shardio.format.blockfile import DEFAULT_MAX_BLOCK_BYTES, RecFileWriter3, ShardIndex3, parse_rec

BOUNDS = [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]
RESULTS = Path(__file__).resolve().parent / "results" / "block_size.json"


def samples_of(kind: str, num_files: int) -> list[dict[str, Any]]:
    """The tree's files as samples ``{__key__, data, label}``."""
    tree = ensure_tree(kind, num_files)
    out = []
    for path in tree.files():
        rel = path.relative_to(tree.root).as_posix()
        out.append({"__key__": rel, "data": path.read_bytes(), "label": tree.label_of(rel)})
    return out


def measure(samples: list[dict[str, Any]], bound: int) -> dict[str, float]:
    """The figures of one block bound on one tree's samples."""
    fh = io.BytesIO()
    writer = RecFileWriter3(fh, max_block_bytes=bound)
    for sample in samples:
        writer.append(sample)
    writer.finish()
    buf = memoryview(fh.getvalue())
    index = parse_rec(buf[:32], buf, len(buf), path="bench")
    assert index.block_offsets is not None
    sizes = [int(index.block_offsets[b + 1] - index.block_offsets[b])
             for b in range(index.num_blocks)]
    counts = [int(index.first_records[b + 1] - index.first_records[b])
              for b in range(index.num_blocks)]
    value_bytes = sum(len(s["data"]) + 8 for s in samples)
    rng = random.Random(0)
    picks = [rng.randrange(index.num_records) for _ in range(500)]
    random_s = min(_time_random(buf, index, picks) for _ in range(5)) / len(picks)
    seq_s = min(_time_sequential(buf, index) for _ in range(5)) / index.num_records
    return {
        "bound": bound, "num_blocks": index.num_blocks,
        "records_per_block": index.num_records / index.num_blocks,
        "record_bytes": value_bytes / len(samples),
        "random_bytes_per_access": sum(s * c for s, c in zip(sizes, counts, strict=True))
        / index.num_records,
        "random_us": random_s * 1e6, "sequential_us_per_sample": seq_s * 1e6,
        "stored_ratio": len(buf) / value_bytes,
    }


def _block(buf: memoryview, index: ShardIndex3, b: int) -> memoryview:
    assert index.block_offsets is not None
    return buf[int(index.block_offsets[b]) : int(index.block_offsets[b + 1])]


def _time_random(buf: memoryview, index: ShardIndex3, picks: list[int]) -> float:
    start = time.perf_counter()
    for record in picks:
        b, pos = index.locate(record)
        block = _block(buf, index, b)
        check_block(block, path="bench", block=b)
        head = read_head(block, path="bench", block=b)
        for column in decode_columns(block, head, path="bench", block=b):
            column.value(pos)
    return time.perf_counter() - start


def _time_sequential(buf: memoryview, index: ShardIndex3) -> float:
    start = time.perf_counter()
    for b in range(index.num_blocks):
        decode_block(_block(buf, index, b), path="bench", block=b)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Measure every bound on both trees and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", type=int, default=4000)
    parser.add_argument("--images", type=int, default=200)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"question": __doc__.split("\n")[0], "trees": {}}
    for kind, count in (("tiny", args.tiny), ("images", args.images)):
        samples = samples_of(kind, count)
        rows = [measure(samples, bound) for bound in BOUNDS]
        results["trees"][kind] = {"num_samples": len(samples), "rows": rows}
        for row in rows:
            print(kind, json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def block_size_block(path: Path | None = None) -> str:
    """docs/format.md's table of bounds (§8.2), from ``results/block_size.json``."""
    results = json.loads((path or RESULTS).read_text(encoding="utf-8"))
    tiny, images = (results["trees"][kind] for kind in ("tiny", "images"))
    lines = [f"`python -m benchmarks.bench_block_size`: {tiny['num_samples']:,} tiny files of "
             f"1–4 KB with a label, {images['num_samples']:,} JPEGs of 60–110 KB with a label; "
             "one shard per bound, zstd level 3; min of 5 rounds on the project's 2-core machine:",
             "", "| bound | tiny: records/block | tiny: bytes read per random record | tiny: "
             "random record µs | tiny: sequential µs/sample | images: bytes read per random "
             "record | images: sequential µs/sample |", "|---|---|---|---|---|---|---|"]
    for row, image in zip(tiny["rows"], images["rows"], strict=True):
        bound = row["bound"]
        label = f"{bound >> 20} MiB" if bound >= 1 << 20 else f"{bound >> 10} KiB"
        cells = [label, f"{row['records_per_block']:.0f}",
                 f"{row['random_bytes_per_access']:,.0f}", f"{row['random_us']:.0f}",
                 f"{row['sequential_us_per_sample']:.1f}",
                 f"{image['random_bytes_per_access']:,.0f}",
                 f"{image['sequential_us_per_sample']:.1f}"]
        if bound == DEFAULT_MAX_BLOCK_BYTES:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
