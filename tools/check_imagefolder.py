"""Check shardio's ImageFolder rules against the real ``torchvision.datasets.ImageFolder``.

shardio must not depend on torchvision, so the test suite checks the rules as
written down; this tool checks them against torchvision itself, in an
environment that has it (torchvision does not import beside the CPU build of
torch the project tests with; see README). It builds an awkward tree — nested
folders, spaces, unicode, upper-case extensions, names that sort differently
as paths than as strings — unless given one, then compares ``classes``,
``class_to_idx`` and the sample order (``pack --no-shuffle`` stores
``ImageFolder(root).samples`` in that order).

    python tools/check_imagefolder.py            # generated tree
    python tools/check_imagefolder.py ROOT       # your tree

Exit status 0 when both agree, 1 with a diff otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from shardio.packing.sources.files import scan_source
from shardio.synth import make_photo

AWKWARD_FILES = (
    "cat/a.jpg",
    "cat/B.JPG",
    "cat/a b/x.jpeg",
    "cat/a/x.png",
    "cat/a/b/c/deep.jpg",
    "dog/ünïcode.jpg",
    "dog/with space.jpg",
    "dog/z.webp",
    "dog/0.bmp",
    "Zebra/x.jpg",
    "apple pie/x.jpg",
    "ñandú/x.jpg",
    "10/x.jpg",
    "9/x.jpg",
)


def make_awkward_tree(root: Path) -> None:
    """Write a small tree whose class and file order is easy to get wrong."""
    rng = np.random.default_rng(0)
    formats = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP"}
    for rel in AWKWARD_FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fmt = formats[path.suffix.lower()]
        path.write_bytes(make_photo(rng, 16, 12, fmt=fmt))


def compare(root: Path) -> list[str]:
    """Differences between shardio's view of ``root`` and torchvision's, as readable lines."""
    from torchvision.datasets import ImageFolder

    theirs = ImageFolder(str(root))
    ours = scan_source(root, imagefolder=True)
    problems = []
    if list(ours.classes or ()) != list(theirs.classes):
        problems.append(f"classes: shardio {ours.classes} vs torchvision {theirs.classes}")
    ours_idx = {c: i for i, c in enumerate(ours.classes or ())}
    if ours_idx != theirs.class_to_idx:
        problems.append(f"class_to_idx: shardio {ours_idx} vs torchvision {theirs.class_to_idx}")
    their_samples = [(Path(p).relative_to(root).as_posix(), label) for p, label in theirs.samples]
    our_samples = [(s.key, s.label) for s in ours.samples]
    if our_samples != their_samples:
        for i, (a, b) in enumerate(zip(our_samples, their_samples, strict=False)):
            if a != b:
                problems.append(f"sample {i}: shardio {a} vs torchvision {b}")
                break
        if len(our_samples) != len(their_samples):
            problems.append(
                f"{len(our_samples)} samples in shardio, {len(their_samples)} in torchvision"
            )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "root", nargs="?", type=Path, help="an ImageFolder tree (default: generated)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root
        if root is None:
            root = Path(tmp) / "awkward"
            make_awkward_tree(root)
        problems = compare(root)
    for line in problems:
        print(line)
    print("torchvision and shardio agree" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
