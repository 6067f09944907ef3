"""Generated blocks of the READMEs and docs: every figure there comes from a committed results file.

A document marks a block with two HTML comments::

    <!-- generated:NAME (python -m benchmarks.readme writes this block; edit the code) -->
    ...
    <!-- end generated:NAME -->

and ``BLOCKS`` says which function renders ``NAME``. Each function takes no argument,
reads committed files under ``benchmarks/results/`` and returns the block's markdown
(without the markers). Adding a block is one function anywhere under ``benchmarks/``
plus one line in ``BLOCKS``, then the two markers in the document and
``python -m benchmarks.readme`` to fill them. ``tests/project/test_readme_blocks.py`` (in the
default suite) fails when a document's block differs from what its function renders
now, so a figure typed by hand, or a results file changed without rerendering, is found.

``python -m benchmarks.readme`` rewrites every block in place; ``--check`` only reports
the stale ones (exit status 1).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"

DOCUMENTS = ("README.md", "benchmarks/README.md", "docs/remote.md", "docs/import.md",
             "docs/doctor.md", "docs/guarantees.md", "docs/performance.md",
             "docs/decisions.md", "docs/format.md", "docs/results.md")
"""Documents (relative to the repository) scanned for generated blocks."""

BLOCKS: dict[str, str] = {
    "guarantees": "benchmarks.stress_corruption:guarantees_block",
    "bench-summary": "benchmarks.headline:summary_block",
    "readme-headline": "benchmarks.readme_headline:headline_block",
    "bench-tables": "benchmarks.report:tables_block",
    "pack-tar": "benchmarks.pack_report:tar_block",
    "pack-engines": "benchmarks.pack_report:engines_block",
    "pack-scan": "benchmarks.pack_report:scan_block",
    "pack-estimate": "benchmarks.pack_report:estimate_block",
    "bench-handover": "benchmarks.bench_handover:handover_block",
    "bench-decode": "benchmarks.decisions:decode_block",
    "lmdb-check": "benchmarks.decisions:lmdbcheck_block",
    "bench-checksum": "benchmarks.decisions:checksum_block",
    "bench-cold": "benchmarks.bench_cold:cold_block",
    "block-size": "benchmarks.decisions:block_size_block",
    "block-bound-warm": "benchmarks.decisions:block_bound_warm_block",
    "warm-v2": "benchmarks.decisions:warm_block",
    "bench-warm": "benchmarks.bench_warm:warm_block",
    "bench-dataloader-workers": "benchmarks.decisions:dataloader_block",
    "bench-first-sample": "benchmarks.first_sample:first_sample_block",
    "bench-memory": "benchmarks.bench_memory:memory_block",
    "bench-gpu": "benchmarks.bench_gpu:gpu_block",
    "bench-crop": "benchmarks.decisions:crop_block",
    "s3-request": "benchmarks.decisions:s3_request_block",
    "remote-ab": "benchmarks.remote_ab:ab_block",
    "remote-first-batch": "benchmarks.remote_report:first_batch_block",
    "remote-ab-uncapped": "benchmarks.remote_ab:ab_uncapped_block",
    "import": "benchmarks.bench_import:import_block",
    "doctor": "benchmarks.bench_doctor:doctor_block",
    "telemetry": "benchmarks.decisions:telemetry_block",
    "integrity-checks": "benchmarks.decisions:integrity_block",
    "batch-split": "benchmarks.decisions:batch_split_block",
    "perf-systems": "benchmarks.performance:systems_block",
    "perf-remote": "benchmarks.performance:remote_block",
}
"""Block name -> ``"module:function"`` rendering it; imported only when rendered."""

_BLOCK = re.compile(
    r"(?P<begin><!-- generated:(?P<name>[A-Za-z0-9_-]+)\b[^>]*-->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- end generated:(?P=name) -->)",
    re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    """One generated block found in a document."""

    document: str
    name: str
    text: str


def render_block(name: str) -> str:
    """The markdown of block ``name``, rendered now from the committed results.

    Raises:
        KeyError: ``name`` is not in ``BLOCKS``.
    """
    module, _, function = BLOCKS[name].partition(":")
    render: Callable[[], str] = getattr(importlib.import_module(module), function)
    return render().rstrip("\n") + "\n"


def find_blocks(*, root: Path = REPO) -> list[Block]:
    """Every generated block in ``DOCUMENTS``, in document order."""
    found = []
    for document in DOCUMENTS:
        text = (root / document).read_text(encoding="utf-8")
        found += [Block(document, m["name"], m["body"]) for m in _BLOCK.finditer(text)]
    return found


def stale_blocks(*, root: Path = REPO) -> list[str]:
    """Problems, one line each: blocks that differ from their rendering, unknown or unused names.

    An empty list means every document shows exactly what the report code renders from
    the committed results.
    """
    problems = []
    blocks = find_blocks(root=root)
    for block in blocks:
        if block.name not in BLOCKS:
            problems.append(f"{block.document}: block {block.name!r} is not registered in "
                            "benchmarks/readme.py BLOCKS")
        elif block.text != render_block(block.name):
            problems.append(f"{block.document}: block {block.name!r} differs from what "
                            f"{BLOCKS[block.name]} renders; run python -m benchmarks.readme")
    used = {block.name for block in blocks}
    problems += [f"block {name!r} ({BLOCKS[name]}) appears in none of {', '.join(DOCUMENTS)}"
                 for name in BLOCKS if name not in used]
    return problems


def write_blocks(*, root: Path = REPO) -> list[str]:
    """Rewrite every registered block of every document in place; the documents changed."""
    changed = []
    for document in DOCUMENTS:
        path = root / document
        text = path.read_text(encoding="utf-8")

        def fill(match: re.Match[str]) -> str:
            if match["name"] not in BLOCKS:
                return match[0]
            return match["begin"] + render_block(match["name"]) + match["end"]

        new = _BLOCK.sub(fill, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(document)
    return changed


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated blocks, or with ``--check`` list the stale ones."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="report stale blocks, change nothing")
    args = p.parse_args(argv)
    if args.check:
        problems = stale_blocks()
        for line in problems:
            print(line)
        return 1 if problems else 0
    for document in write_blocks():
        print(f"rewrote {document}")
    for line in stale_blocks():  # unregistered or unused names cannot be fixed by rewriting
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
