"""What a source folder holds: its samples in canonical order, and what was left out and why.

This module owns the rules that turn the files of SRC (found by
``shardio.packing.walk``: which files count, which are bad and why) into samples: how
files group into samples (the WebDataset stem rule of ``shardio.packing.stems``, or one
image per sample in an ImageFolder), ImageFolder detection and its classes, the
samples' canonical order, the input digest a resume checks, and which files
are bad as samples (not an image in an ImageFolder, a reserved field name, …).
The walk and the rules that need one folder only run in tasks
(``shardio.packing.scan``); this module merges and orders what they return. It never
reads file contents (``shardio.packing.build`` does that) and imports nothing
from shardio but ``errors``, ``walk``, ``stems`` and ``scan``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

from shardio.errors import BadInputError
from shardio.format.manifest import IMG_EXTENSIONS
from shardio.packing.scan import Listing, WalkPool, WalkSpec, walk_tree
from shardio.packing.stems import RESERVED_FIELDS, SourceSample, row
from shardio.packing.walk import Bad, Walker, display_path, is_utf8, selector

__all__ = ["IMAGEFOLDER_RULES", "IMG_EXTENSIONS", "RESERVED_FIELDS", "Bad", "PackSource",
           "SourceSample", "dataset_source", "display_path", "imagefolder_order", "scan_source"]


@dataclass(frozen=True)
class PackSource:
    """A scanned source: samples in canonical (pre-shuffle) order and everything left out."""

    root: str
    samples: tuple[SourceSample, ...]
    classes: tuple[str, ...] | None
    hidden_ignored: int
    bad: tuple[Bad, ...]
    digest: str
    """sha256 over every file's path, size, mtime and verdict, in canonical order."""
    excluded: int = 0
    class_folders: bool = False
    """Generic samples labelled by their top-level folder (``classes`` are those folders)."""
    origin: str = "folder"
    """What SRC was: ``"folder"`` (files), or the container its samples are read from
    (``"webdataset"``: ``shardio.packing.sources.tars``); only a folder can be an ImageFolder."""
    notes: tuple[str, ...] = ()
    """What the summary must say about how samples were made (images encoded as PNG)."""

    @property
    def is_imagefolder(self) -> bool:
        """ImageFolder samples: fields ``image`` and ``label``."""
        return self.classes is not None and not self.class_folders and self.origin == "folder"


NOT_AN_IMAGE: Final = f"not an image: an ImageFolder holds only {' '.join(IMG_EXTENSIONS)} files"
LOOSE_FILE: Final = "a loose file at the top of an ImageFolder, outside every class folder"
LOOSE_CLASS_FILE: Final = ("a loose file at the top of a tree of class folders, outside every "
                           "class folder")
LABEL_CLASH: Final = ("a file whose field is 'label', which class folders give every sample "
                      "(its class index): rename it")
IMAGEFOLDER_RULES: Final = (NOT_AN_IMAGE, LOOSE_FILE)
"""Reasons a file is bad only because SRC is read as an ImageFolder (generic mode keeps it)."""


def _looks_like_imagefolder(listing: Listing) -> bool:
    """Class folders of images: every visible top-level entry is a folder holding an image,
    there are no loose files, and no image shares its name stem with a non-image file.

    ``a/b/x.jpg`` beside ``a/b/x.json`` is one generic sample with two fields (the
    WebDataset rule); read as an ImageFolder, the JSON would be bad input, and
    ``--skip-bad`` would drop it. A stray non-image file of its own (``notes.txt``)
    does not make a tree generic: packing it without labels would be the silent
    surprise, so it is reported as bad in ImageFolder mode instead.
    """
    walker = listing.walker
    if not walker.top_dirs or walker.top_other or listing.clash:
        return False
    return all(d in listing.image_tops for d in walker.top_dirs)


def scan_source(
    src: str | os.PathLike[str],
    *,
    imagefolder: bool | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    follow_symlinks: bool = False,
    pool: WalkPool | None = None,
    walk_root: str | None = None,
    class_folders: bool = False,
) -> PackSource:
    """Walk ``src`` and return its samples in canonical order with everything left out.

    Generic folders follow the WebDataset rule: files in one folder whose names
    share the part before the first dot form one sample, keyed by that relative
    path, one field per file named by the rest of the name; samples are sorted
    by key and fields by name. For ImageFolders see ``imagefolder_order``.

    Hidden entries (names starting with ``.``) are ignored and counted: a hidden
    folder counts once and is not entered. ``include``/``exclude`` are
    ``fnmatch`` globs on a file's relative POSIX path (``*`` also matches ``/``).
    Symlinks are reported as bad unless ``follow_symlinks``; then folders they
    point at are entered unless that makes a loop.

    A file that is bad (empty, unreadable, a special file, a broken or looping
    link, a name that is not UTF-8, not an image inside an ImageFolder, …) takes
    its whole sample with it: ``PackSource.bad`` lists it with its reason, and the
    sample's other files with a note saying why.

    Args:
        src: the folder to pack.
        imagefolder: force ImageFolder (``True``) or generic (``False``) mode;
            ``None`` detects it: every visible top-level entry is a folder that
            holds at least one image, there are no loose files, and no image has
            a non-image sibling with the same name stem (``x.jpg`` + ``x.json``
            make a generic sample).
        include: keep only files matching one of these globs (all when empty).
        exclude: drop files matching one of these globs.
        follow_symlinks: read the targets of symbolic links and enter linked folders.
        pool: walk subtrees in these parallel tasks (``shardio.packing.scan``); the result
            is the same as without.
        walk_root: the path the tasks walk, when it is not ``src`` (the absolute
            path, for workers whose working folder differs); samples still name
            their files under ``src``.
        class_folders: generic samples, each also labelled with its top-level
            folder's index among the sorted top-level folders (torchvision's
            ``DatasetFolder`` for any file type): ``classes`` are those folders.
            A sample outside every class folder, or with a field named
            ``label``, is bad.

    Raises:
        BadInputError: ``src`` is not a folder.
        ValueError: ``class_folders`` with ``imagefolder=True``.
    """
    if class_folders and imagefolder:
        raise ValueError("class_folders labels generic samples; an ImageFolder (imagefolder=True) "
                         "is labelled by its class folders already: pass one of the two")
    if class_folders:
        imagefolder = False
    root = os.fspath(src)
    if not os.path.isdir(root):
        what = "does not exist" if not os.path.lexists(root) else "is not a folder"
        raise BadInputError(f"{root}: the source {what}; pass a folder to pack", path=root)
    walker = Walker(root, selector(include, exclude), follow_symlinks)
    listing = Listing(walker)
    spec = WalkSpec(walk_root or root, os.path.join(root, ""), tuple(include), tuple(exclude),
                    follow_symlinks, imagefolder)
    walk_tree(spec, listing, pool)
    if imagefolder is None:
        imagefolder = _looks_like_imagefolder(listing)
    builder = _imagefolder_samples if imagefolder else _generic_samples
    classes, samples, bad, rows = builder(listing)
    if class_folders:
        classes, samples = _label_by_folder(walker.top_dirs, samples, bad)
    bad.extend(walker.bad_dirs)
    rows += [row(rel, 0, 0, reason) for rel, reason in sorted(walker.bad_dirs)]
    kind = "classfolders" if class_folders else "imagefolder"
    head = "generic\n" if classes is None else f"{kind}\n" + "\0".join(classes) + "\n"
    return PackSource(
        root=root, samples=tuple(samples), classes=classes, hidden_ignored=walker.hidden,
        bad=tuple(sorted(bad)), digest=_hash(head, rows), excluded=walker.excluded,
        class_folders=class_folders,
    )


def _label_by_folder(tops: Sequence[str] | set[str], samples: list[SourceSample],
                     bad: list[Bad]) -> tuple[tuple[str, ...], list[SourceSample]]:
    """The classes (sorted top-level folders) and each sample labelled with its folder's
    index; samples outside every folder, or with a ``label`` field, go to ``bad``."""
    classes = tuple(sorted(tops))
    index = {c: i for i, c in enumerate(classes)}
    labelled = []
    for sample in samples:
        top, slash, _ = sample.key.partition("/")
        reason = (LOOSE_CLASS_FILE if not slash or top not in index
                  else LABEL_CLASH if "label" in sample.fields else None)
        if reason is None:  # _make: a tenth of _replace's cost, on millions of samples
            labelled.append(SourceSample._make((*sample[:4], index[top], sample[5])))
        else:
            bad.extend(sample.bad(sample.fields.index("label") if reason is LABEL_CLASH else 0,
                                  reason))
    return classes, labelled


_Built = tuple["tuple[str, ...] | None", list[SourceSample], list[Bad], list[str]]


def _hash(head: str, rows: Sequence[str]) -> str:
    """sha256 over the ``stems.row`` lines (``rel, size, mtime_ns, reason``) of every file."""
    digest = hashlib.sha256(head.encode("utf-8", "surrogateescape"))
    for i in range(0, len(rows), 4096):
        digest.update("".join(rows[i : i + 4096]).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _generic_samples(listing: Listing) -> _Built:
    """The samples the tasks grouped, in key order (keys are unique)."""
    groups = sorted(listing.groups, key=itemgetter(0))
    samples = [g[2] for g in groups if g[2] is not None]
    bad = [b for g in groups if g[3] for b in g[3]]
    return None, samples, bad, [g[1] for g in groups]


def imagefolder_order(rel: str, class_index: int) -> tuple[int, str, str]:
    """Sort key that puts images in ``torchvision.datasets.ImageFolder``'s order.

    torchvision lists classes as the sorted names of SRC's sub-folders, so
    ``class_to_idx`` is ``{name: position}``. It then visits classes in that
    order, and within a class ``sorted(os.walk(class_dir, followlinks=True))``:
    folders sorted by their whole path string (so ``cls/a b`` comes before
    ``cls/a/x`` because ``' ' < '/'``), and files within a folder sorted by
    name, keeping those whose lower-cased name ends in one of ``IMG_EXTENSIONS``
    (nested sub-folders count). With ``--no-shuffle`` the sample at index ``i``
    is ``ImageFolder(SRC).samples[i]``.

    Where shardio differs: hidden entries are ignored and counted (torchvision
    takes a dot-folder such as ``.ipynb_checkpoints`` as a class and packs
    ``._x.jpg`` files); symlinked class folders are followed only with
    ``--follow-symlinks`` (torchvision always follows); a class folder with no
    images stays a class (torchvision raises unless ``allow_empty``); and
    non-image files are reported as bad instead of silently passed over.
    """
    folder, _, name = rel.rpartition("/")
    return class_index, folder, name


def _imagefolder_samples(listing: Listing) -> _Built:
    walker = listing.walker
    prefix = os.path.join(walker.root, "")
    classes = tuple(sorted(walker.top_dirs))
    index = {c: i for i, c in enumerate(classes)}
    good: list[tuple[tuple[int, str, str], str, int]] = []
    bad: list[Bad] = []
    rows: list[str] = []
    for rel, size, mtime, reason in sorted(walker.files):
        top, slash, _ = rel.partition("/")
        if reason is None and not slash:
            reason = LOOSE_FILE
        elif reason is None and not rel.lower().endswith(IMG_EXTENSIONS):
            reason = NOT_AN_IMAGE
        rows.append(row(rel, size, mtime, reason))
        if reason is not None:
            bad.append((display_path(rel), reason))
        else:
            good.append((imagefolder_order(rel, index[top]), rel, size))
    good.sort(key=lambda g: g[0])
    samples = [SourceSample(rel, ("image",), (prefix + rel,), (size,), order[0], size)
               for order, rel, size in good]
    return classes, samples, bad, rows


def dataset_source(
    dataset: Any, *, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> PackSource:
    """The source described by a torchvision ``ImageFolder``/``DatasetFolder``-like object.

    Anything with ``.samples`` (``[(path, class_index), …]``), ``.classes`` and
    ``.class_to_idx`` works; torchvision is never imported. Samples keep the
    object's order; keys are paths relative to ``dataset.root`` (or to the
    folder all samples share, when it has no ``root``). The object names its
    files explicitly, so symbolic links among them are always followed.

    Raises:
        ValueError: ``class_to_idx`` disagrees with the order of ``classes``, or a
            label is not an index into ``classes``.
    """
    pairs = [(os.fspath(p), label) for p, label in dataset.samples]
    classes = tuple(str(c) for c in dataset.classes)
    if dict(dataset.class_to_idx) != {c: i for i, c in enumerate(classes)}:
        raise ValueError(
            "dataset.class_to_idx must map each name in dataset.classes to its position "
            f"(got {dict(dataset.class_to_idx)} for classes {list(classes)})"
        )
    root = getattr(dataset, "root", None)
    root = os.fspath(root) if root is not None else os.path.commonpath(
        [os.path.dirname(os.path.abspath(p)) for p, _ in pairs] or ["."])
    walker = Walker(root, selector(include, exclude), True)
    seen: set[str] = set()
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    rows: list[str] = []
    for path, label in pairs:
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if not isinstance(label, int) or not 0 <= label < len(classes):
            raise ValueError(f"{path}: label {label!r} is not an index into dataset.classes")
        if walker.select is not None and not walker.select(rel):
            walker.excluded += 1
            continue
        reason: str | None
        try:
            st = os.stat(path)
        except OSError as exc:
            reason, size, mtime = f"cannot be examined ({exc.strerror})", 0, 0
        else:
            reason, mtime = walker.verdict(st), st.st_mtime_ns
            size = st.st_size if reason is None else 0
        if reason is None and (rel == ".." or rel.startswith("../")):
            reason = "outside dataset.root"
        if reason is None and rel in seen:
            reason = "listed twice in dataset.samples"
        if reason is None and not is_utf8(rel):
            reason = "name is not valid UTF-8; rename it"
        seen.add(rel)
        rows.append(row(f"{label}\0{rel}", size, mtime, reason))
        if reason is None:
            samples.append(SourceSample(rel, ("image",), (path,), (size,), label, size))
        else:
            bad.append((display_path(rel), reason))
    return PackSource(
        root=root, samples=tuple(samples), classes=classes, hidden_ignored=0,
        bad=tuple(sorted(bad)), excluded=walker.excluded,
        digest=_hash("dataset\n" + "\0".join(classes) + "\n", rows),
    )
