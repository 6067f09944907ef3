"""The one seeded data generator every benchmark reads: photo-like JPEGs and a tiny-file tree.

Both trees are built from ``shardio.synth`` and cached under ``benchmarks/data/`` in a
folder named after every parameter that changes the bytes, so a second run (or another
benchmark) reuses them and two runs with the same flags measure the same files. A tree
counts as cached only once its ``<folder>.json`` (beside it, so that no system packs it)
exists, which is written last.

* ``images``: an ImageFolder, ``class_XX/img_NNNNNN.jpg``, 10 classes, files created in
  class order, 400-500 px long side, JPEG quality 92 (60-110 KB each).
* ``tiny``: ``cXX/dYY/dZZ/file_NNNNNNN.bin``, 1-4 KB each; the class of a file is its
  top-level folder ``cXX``, so shuffle quality can be measured on it too.

Usage: ``python -m benchmarks.datagen [--quick] [--images N] [--tiny N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from shardio.synth import make_imagefolder, make_tiny_tree

DATA_ROOT = Path(__file__).resolve().parent / "data"
GENERATOR_VERSION = 1
NUM_CLASSES = 10
FULL_SIZES = {"images": 8000, "tiny": 100_000}
QUICK_SIZES = {"images": 1000, "tiny": 10_000}


@dataclass(frozen=True)
class Tree:
    """A generated tree on disk and what it holds."""

    kind: str
    root: Path
    num_files: int
    num_bytes: int
    num_classes: int

    def files(self) -> list[Path]:
        """Every file of the tree, sorted by relative path (class order)."""
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def label_of(self, relative: str) -> int:
        """Class index of a file from its top-level folder (``class_03`` or ``c03`` -> 3)."""
        top = relative.split("/", 1)[0]
        return int(top.rsplit("_", 1)[-1].lstrip("c"))


def tree_dir(kind: str, num_files: int, seed: int, data_root: Path = DATA_ROOT) -> Path:
    """Cache folder for one parameter set."""
    return data_root / f"{kind}-n{num_files}-c{NUM_CLASSES}-s{seed}-v{GENERATOR_VERSION}"


def _write_images(root: Path, num_files: int, seed: int) -> tuple[int, int]:
    per_class = num_files // NUM_CLASSES
    stats = make_imagefolder(root, num_classes=NUM_CLASSES, per_class=per_class, seed=seed)
    return stats.num_files, stats.num_bytes


def _write_tiny(root: Path, num_files: int, seed: int) -> tuple[int, int]:
    per_class = num_files // NUM_CLASSES
    files = size = 0
    for c in range(NUM_CLASSES):
        stats = make_tiny_tree(
            root / f"c{c:02d}", num_files=per_class, seed=seed * 1000 + c, fanout=10,
            files_per_folder=50,
        )
        files += stats.num_files
        size += stats.num_bytes
    return files, size


def ensure_tree(
    kind: str, num_files: int, *, seed: int = 0, data_root: Path = DATA_ROOT, log: bool = True
) -> Tree:
    """Return the cached tree for these parameters, generating it first if needed.

    Args:
        kind: ``"images"`` or ``"tiny"``.
        num_files: total files, split evenly over the 10 classes (rounded down).
        seed: the same seed writes the same bytes.
        data_root: the cache folder (default ``benchmarks/data``).
        log: print a line when generating.
    """
    if kind not in FULL_SIZES:
        raise ValueError(f"kind must be one of {sorted(FULL_SIZES)}, got {kind!r}")
    if num_files < NUM_CLASSES:
        raise ValueError(f"num_files must be at least {NUM_CLASSES}, got {num_files}")
    root = tree_dir(kind, num_files, seed, data_root)
    done = root.with_name(root.name + ".json")
    if not done.exists():
        if log:
            print(f"datagen: writing {num_files} {kind} files to {root} ...", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write = _write_images if kind == "images" else _write_tiny
        files, size = write(tmp, num_files, seed)
        os.replace(tmp, root)
        info = {"kind": kind, "num_files": files, "num_bytes": size, "num_classes": NUM_CLASSES}
        done.write_text(json.dumps(info), encoding="utf-8")
    info = json.loads(done.read_text(encoding="utf-8"))
    return Tree(kind, root, int(info["num_files"]), int(info["num_bytes"]), NUM_CLASSES)


def main(argv: list[str] | None = None) -> None:
    """Generate (or find) both trees and print what they hold."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small trees (minutes, not more)")
    parser.add_argument("--images", type=int, help="number of JPEGs (default 8000, quick 1000)")
    parser.add_argument("--tiny", type=int, help="number of tiny files (default 100000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    for kind in ("images", "tiny"):
        tree = ensure_tree(kind, getattr(args, kind) or sizes[kind], seed=args.seed)
        print(json.dumps({**asdict(tree), "root": str(tree.root)}))


if __name__ == "__main__":
    main()
