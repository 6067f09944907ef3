"""The one seeded data generator every benchmark reads: JPEGs, tiny files, multi-field samples,
mixed sizes.

Both trees are built from ``shardio.synth`` and cached under ``benchmarks/data/`` in a
folder named after every parameter that changes the bytes, so a second run (or another
benchmark) reuses them and two runs with the same flags measure the same files. A tree
counts as cached only once its ``<folder>.json`` (beside it, so that no system packs it)
exists, which is written last.

* ``images``: an ImageFolder, ``class_XX/img_NNNNNN.jpg``, 10 classes, files created in
  class order, 400-500 px long side, JPEG quality 92 (60-110 KB each).
* ``tiny``: ``cXX/dYY/dZZ/file_NNNNNNN.bin``, 1-4 KB each; the class of a file is its
  top-level folder ``cXX``, so shuffle quality can be measured on it too.
* ``fields``: samples of two files sharing a stem (the WebDataset rule),
  ``cXX/dYYY/sNNNNNNN.bin`` (1-6 KB of incompressible bytes, like a small encoded image)
  and ``.json`` (200-700 bytes of compressible text: caption, tags, sizes), plus the
  class label of ``cXX``: small samples of several fields, compressible and not.
* ``mixed``: ``cXX/dYYY/file_NNNNNNN.bin`` of incompressible bytes whose sizes are
  long-tailed (log-normal, median 4 KB, 100 B to 4 MB; the largest one or two hundred
  times the median), as a corpus of mixed media is.

A sample is the files of one folder sharing the part of their names before the first
dot (``Tree.samples``); its payload is their bytes in ``FIELDS`` order.

Usage: ``python -m benchmarks.datagen [--quick] [--images N] [--tiny N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from shardio.synth import make_imagefolder, make_tiny_tree

DATA_ROOT = Path(__file__).resolve().parent / "data"
GENERATOR_VERSION = 1
NUM_CLASSES = 10
FULL_SIZES = {"images": 8000, "tiny": 100_000, "fields": 100_000, "mixed": 20_000}
QUICK_SIZES = {"images": 1000, "tiny": 10_000, "fields": 10_000, "mixed": 4000}
FIELDS = {"images": ("jpg",), "tiny": ("bin",), "fields": ("bin", "json"), "mixed": ("bin",)}
"""Each tree's fields: the suffixes of a sample's files, in the order its payload lists them."""
SMALL = frozenset({"tiny", "fields"})
"""Trees of small samples, whose cold epochs are judged against the baseline, not ``cat``."""
PER_FOLDER = 100
WORDS = ("a", "photo", "of", "the", "red", "cat", "dog", "car", "tree", "house", "river",
         "street", "mountain", "person", "sitting", "on", "near", "under", "with", "small",
         "large", "old", "new", "bright", "dark", "wooden", "white", "black", "green")


@dataclass(frozen=True)
class Tree:
    """A generated tree on disk and what it holds."""

    kind: str
    root: Path
    num_files: int
    num_bytes: int
    num_classes: int

    @property
    def fields(self) -> tuple[str, ...]:
        """The suffixes of a sample's files, in payload order."""
        return FIELDS[self.kind]

    def files(self) -> list[Path]:
        """Every file of the tree, sorted by relative path (class order)."""
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def samples(self) -> list[tuple[str, list[Path]]]:
        """``(key, the sample's files in field order)`` of every sample, in class order."""
        if len(self.fields) == 1:
            return [(p.relative_to(self.root).as_posix().split(".", 1)[0], [p])
                    for p in self.files()]
        groups: dict[str, dict[str, Path]] = {}
        for p in self.files():
            stem, _, suffix = p.relative_to(self.root).as_posix().partition(".")
            groups.setdefault(stem, {})[suffix] = p
        return [(key, [files[f] for f in self.fields]) for key, files in groups.items()]

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


def _random_files(root: Path, sizes: np.ndarray, seed: int, name: str,
                  extra: Callable[[int, np.random.Generator], bytes] | None = None) -> int:
    """``sizes[i]`` incompressible bytes per sample, spread over the classes; bytes written."""
    rng = np.random.default_rng(seed)
    total = 0
    per_class = len(sizes) // NUM_CLASSES
    for i, size in enumerate(sizes[:per_class * NUM_CLASSES]):
        folder = root / f"c{i // per_class:02d}" / f"d{i % per_class // PER_FOLDER:03d}"
        if i % per_class % PER_FOLDER == 0:
            folder.mkdir(parents=True, exist_ok=True)
        data = rng.integers(0, 256, int(size), dtype=np.uint8).tobytes()
        (folder / f"{name}{i:07d}.bin").write_bytes(data)
        total += len(data)
        if extra is not None:
            text = extra(i, rng)
            (folder / f"{name}{i:07d}.json").write_bytes(text)
            total += len(text)
    return total


def _caption(index: int, rng: np.random.Generator) -> bytes:
    words = rng.choice(len(WORDS), int(rng.integers(8, 40)))
    return json.dumps({
        "id": index, "caption": " ".join(WORDS[w] for w in words),
        "tags": [WORDS[w] for w in rng.choice(len(WORDS), int(rng.integers(2, 12)))],
        "width": int(rng.integers(64, 1024)), "height": int(rng.integers(64, 1024)),
        "source": f"https://example.com/images/{index:07d}.jpg", "license": "CC-BY-4.0",
    }).encode()


def _write_fields(root: Path, num_files: int, seed: int) -> tuple[int, int]:
    sizes = np.random.default_rng(seed).integers(1024, 6 * 1024, num_files)
    size = _random_files(root, sizes, seed + 1, "s", extra=_caption)
    return num_files // NUM_CLASSES * NUM_CLASSES, size


def _write_mixed(root: Path, num_files: int, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.exp(rng.normal(np.log(4096), 1.5, num_files)), 100, 4 << 20)
    size = _random_files(root, sizes.astype(np.int64), seed + 1, "file_")
    return num_files // NUM_CLASSES * NUM_CLASSES, size


_WRITERS = {"images": _write_images, "tiny": _write_tiny, "fields": _write_fields,
            "mixed": _write_mixed}


def ensure_tree(
    kind: str, num_files: int, *, seed: int = 0, data_root: Path = DATA_ROOT, log: bool = True
) -> Tree:
    """Return the cached tree for these parameters, generating it first if needed.

    Args:
        kind: ``"images"``, ``"tiny"``, ``"fields"`` or ``"mixed"``.
        num_files: total samples, split evenly over the 10 classes (rounded down).
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
        files, size = _WRITERS[kind](tmp, num_files, seed)
        os.replace(tmp, root)
        info = {"kind": kind, "num_files": files, "num_bytes": size, "num_classes": NUM_CLASSES}
        done.write_text(json.dumps(info), encoding="utf-8")
    info = json.loads(done.read_text(encoding="utf-8"))
    return Tree(kind, root, int(info["num_files"]), int(info["num_bytes"]), NUM_CLASSES)


def main(argv: list[str] | None = None) -> None:
    """Generate (or find) every tree and print what it holds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small trees (minutes, not more)")
    parser.add_argument("--images", type=int, help="number of JPEGs (default 8000, quick 1000)")
    parser.add_argument("--tiny", type=int, help="number of tiny files (default 100000)")
    parser.add_argument("--fields", type=int, help="multi-field samples (default 100000)")
    parser.add_argument("--mixed", type=int, help="mixed-size files (default 20000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    for kind in FULL_SIZES:
        tree = ensure_tree(kind, getattr(args, kind) or sizes[kind], seed=args.seed)
        print(json.dumps({**asdict(tree), "root": str(tree.root)}))


if __name__ == "__main__":
    main()
