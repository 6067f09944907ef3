"""What a source folder holds: its samples in canonical order, and what was left out and why.

This module owns the rules that turn SRC into samples: which files count
(hidden entries are ignored and counted; ``include``/``exclude`` globs;
symlinks), how files group into samples (the WebDataset stem rule, or one image
per sample in an ImageFolder), ImageFolder detection and its classes, and which
inputs are bad and why. It reads directory entries and ``lstat`` results only,
never file contents (``shardio.pack`` does that), and imports nothing from
shardio but ``errors``.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from shardio.errors import BadInputError

IMG_EXTENSIONS: Final = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""torchvision's ``IMG_EXTENSIONS``, matched case-insensitively against the end of the name."""

RESERVED_FIELDS: Final = ("__key__", "__index__")

Bad = tuple[str, str]
"""``(path relative to the source, reason)`` of one input that was not packed."""

_FileEntry = tuple[str, str, int, int, "str | None"]
"""``(relative POSIX path, OS path, size, mtime_ns, reason it is bad or None)``."""


class SourceSample(NamedTuple):
    """One sample to pack: its key, and per field the file holding the field's bytes."""

    key: str
    fields: tuple[str, ...]
    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    label: int | None
    num_bytes: int

    def rel_paths(self) -> tuple[str, ...]:
        """Each field's file relative to the source root, as the naming rules rebuild it."""
        if self.label is not None:
            return (self.key,)
        return tuple(f"{self.key}.{f}" if f else self.key for f in self.fields)

    def bad(self, failed: int, reason: str) -> list[Bad]:
        """The skipped entries when file ``failed`` is bad: it, and its companions."""
        rels = [display_path(r) for r in self.rel_paths()]
        return [(rel, reason if i == failed else f"left out with the rest of sample "
                 f"{display_path(self.key)!r} because {rels[failed]} is bad")
                for i, rel in enumerate(rels)]


@dataclass(frozen=True)
class Source:
    """A scanned source: samples in canonical (pre-shuffle) order and everything left out."""

    root: str
    samples: tuple[SourceSample, ...]
    classes: tuple[str, ...] | None
    hidden_ignored: int
    bad: tuple[Bad, ...]
    digest: str
    """sha256 over every file's path, size, mtime and verdict, in canonical order."""
    excluded: int = 0


def display_path(rel: str) -> str:
    """``rel`` made printable: bytes that are not UTF-8 appear as ``\\xNN``."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _selector(include: Sequence[str], exclude: Sequence[str]) -> Callable[[str], bool] | None:
    if not include and not exclude:
        return None
    inc = re.compile("|".join(fnmatch.translate(g) for g in include)) if include else None
    exc = re.compile("|".join(fnmatch.translate(g) for g in exclude)) if exclude else None
    return lambda rel: (inc is None or inc.match(rel) is not None) and (
        exc is None or exc.match(rel) is None
    )


_SPECIAL = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


class _Walker:
    """One recursive ``scandir`` pass collecting files, bad folders and counts."""

    def __init__(
        self, root: str, select: Callable[[str], bool] | None, follow_symlinks: bool
    ) -> None:
        self.root = root
        self.select = select
        self.follow = follow_symlinks
        self.files: list[_FileEntry] = []
        self.bad_dirs: list[Bad] = []
        self.top_dirs: list[str] = []
        self.top_other = 0
        self.hidden = 0
        self.excluded = 0
        self.euid = os.geteuid() if hasattr(os, "geteuid") else 0
        self.groups = set(os.getgroups()) | {os.getegid()} if self.euid else set()

    def walk(self, path: str, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as exc:
            reason = f"folder cannot be read ({exc.strerror})"
            self.bad_dirs.append((display_path(rel or "."), reason))
            return
        select, files, fast = self.select, self.files, bool(rel) and not self.euid
        for entry in entries:
            name = entry.name
            if name[0] == ".":
                self.hidden += 1
                continue
            erel = rel + name
            try:
                if not name.isascii() and not _is_utf8(name):
                    folder = entry.is_dir(follow_symlinks=False)
                    self._bad(erel, entry.path, "folder name is not valid UTF-8; rename it (e.g. "
                              "with `convmv`); nothing inside it was packed" if folder else
                              "name is not valid UTF-8; rename it (e.g. with `convmv`)", folder)
                elif entry.is_dir(follow_symlinks=False):
                    self._enter(entry.path, erel, ancestors, entry)
                elif entry.is_symlink():
                    self._symlink(entry.path, erel, ancestors)
                elif select is None or select(erel):
                    st = entry.stat(follow_symlinks=False)
                    if fast and st.st_size and stat.S_ISREG(st.st_mode):
                        files.append((erel, entry.path, st.st_size, st.st_mtime_ns, None))
                    else:
                        self._add(erel, entry.path, st)
                else:
                    self.excluded += 1
            except OSError as exc:
                self._bad(erel, entry.path, f"cannot be examined ({exc.strerror})")

    def _enter(
        self, path: str, rel: str, ancestors: frozenset[tuple[int, int]], entry: Any = None
    ) -> None:
        if self.follow:
            st = entry.stat(follow_symlinks=False) if entry is not None else os.stat(path)
            ancestors = ancestors | {(st.st_dev, st.st_ino)}
        if "/" not in rel:
            self.top_dirs.append(rel)
        self.walk(path, rel + "/", ancestors)

    def _bad(self, rel: str, path: str, reason: str, folder: bool = False) -> None:
        if folder:
            self.bad_dirs.append((display_path(rel) + "/", reason))
        elif self.select is None or self.select(rel):
            self.files.append((rel, path, 0, 0, reason))
        else:
            self.excluded += 1
            return
        if "/" not in rel:
            self.top_other += 1

    def _symlink(self, path: str, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        target = display_path(os.readlink(path))
        try:
            st = os.stat(path)
        except OSError as exc:
            what = {errno.ELOOP: "symbolic link loop", errno.ENOENT: "broken symbolic link"}
            self._bad(rel, path, f"{what.get(exc.errno or 0, 'symbolic link cannot be followed')}"
                                 f" (-> {target}: {exc.strerror})")
            return
        folder = stat.S_ISDIR(st.st_mode)
        if not self.follow:
            self._bad(rel, path, f"symbolic link to a {'folder' if folder else 'file'} (-> "
                      f"{target}); links are not followed by default: pass --follow-symlinks "
                      "to pack what it points to", folder)
        elif folder and (st.st_dev, st.st_ino) in ancestors:
            self._bad(rel, path, f"symbolic link loop (-> {target} is one of its own parents)",
                      True)
        elif folder:
            self._enter(path, rel, ancestors)
        elif self.select is None or self.select(rel):
            self._add(rel, path, st)
        else:
            self.excluded += 1

    def _add(self, rel: str, path: str, st: os.stat_result) -> None:
        reason = self.verdict(st)
        if "/" not in rel:
            self.top_other += 1
        self.files.append((rel, path, st.st_size if reason is None else 0, st.st_mtime_ns, reason))

    def verdict(self, st: os.stat_result) -> str | None:
        """Why a file with this ``stat`` cannot be packed, or None when it can."""
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            return f"{_SPECIAL.get(stat.S_IFMT(mode), 'a special file')}, not a regular file"
        if st.st_size == 0:
            return "empty file (0 bytes)"
        if self.euid and not self._readable(st):
            return f"permission denied (mode {stat.filemode(mode)}); make it readable"
        return None

    def _readable(self, st: os.stat_result) -> bool:
        if st.st_uid == self.euid:
            return bool(st.st_mode & stat.S_IRUSR)
        if st.st_gid in self.groups:
            return bool(st.st_mode & stat.S_IRGRP)
        return bool(st.st_mode & stat.S_IROTH)

    def looks_like_imagefolder(self) -> bool:
        """Every visible top-level entry is a folder holding an image, and nothing else is."""
        if not self.top_dirs or self.top_other:
            return False
        with_images = {f[0].partition("/")[0] for f in self.files
                       if f[0][-5:].lower().endswith(IMG_EXTENSIONS)}
        return all(d in with_images for d in self.top_dirs)


def scan_source(
    src: str | os.PathLike[str],
    *,
    imagefolder: bool | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    follow_symlinks: bool = False,
) -> Source:
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
    its whole sample with it: ``Source.bad`` lists it with its reason, and the
    sample's other files with a note saying why.

    Args:
        src: the folder to pack.
        imagefolder: force ImageFolder (``True``) or generic (``False``) mode;
            ``None`` detects it: every visible top-level entry is a folder that
            holds at least one image, and there are no loose files.
        include: keep only files matching one of these globs (all when empty).
        exclude: drop files matching one of these globs.
        follow_symlinks: read the targets of symbolic links and enter linked folders.

    Raises:
        BadInputError: ``src`` is not a folder.
    """
    root = os.fspath(src)
    if not os.path.isdir(root):
        what = "does not exist" if not os.path.lexists(root) else "is not a folder"
        raise BadInputError(f"{root}: the source {what}; pass a folder to pack", path=root)
    walker = _Walker(root, _selector(include, exclude), follow_symlinks)
    st = os.stat(root)
    walker.walk(root, "", frozenset({(st.st_dev, st.st_ino)}))
    if imagefolder is None:
        imagefolder = walker.looks_like_imagefolder()
    builder = _imagefolder_samples if imagefolder else _generic_samples
    classes, samples, bad, rows = builder(walker)
    bad.extend(walker.bad_dirs)
    rows += [(rel, "", 0, 0, reason) for rel, reason in sorted(walker.bad_dirs)]
    head = "generic\n" if classes is None else "imagefolder\n" + "\0".join(classes) + "\n"
    return Source(
        root=root, samples=tuple(samples), classes=classes, hidden_ignored=walker.hidden,
        bad=tuple(sorted(bad)), digest=_hash(head, rows), excluded=walker.excluded,
    )


_Row = tuple[Any, ...]
_Built = tuple["tuple[str, ...] | None", list[SourceSample], list[Bad], list[_Row]]


def _hash(head: str, rows: Sequence[_Row]) -> str:
    """sha256 over ``rel, size, mtime_ns, reason`` of rows laid out like ``_FileEntry``."""
    digest = hashlib.sha256(head.encode("utf-8", "surrogateescape"))
    for i in range(0, len(rows), 4096):
        text = "".join([f"{f[0]}\0{f[2]}\0{f[3]}\0{f[4] or ''}\n" for f in rows[i : i + 4096]])
        digest.update(text.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _generic_samples(walker: _Walker) -> _Built:
    groups: dict[str, list[tuple[str, str, int, int, str | None, str]]] = {}
    for rel, path, size, mtime, reason in walker.files:
        dot = rel.find(".", rel.rfind("/") + 1)
        key, fld = (rel, "") if dot < 0 else (rel[:dot], rel[dot + 1 :])
        if reason is None and dot >= 0 and not fld:
            reason = "name ends in its only dot, which the sample naming cannot restore; rename it"
        elif reason is None and fld in RESERVED_FIELDS:
            reason = f"field name {fld!r} is reserved; rename the file"
        group = groups.get(key)
        if group is None:
            groups[key] = [(rel, path, size, mtime, reason, fld)]
        else:
            group.append((rel, path, size, mtime, reason, fld))
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    rows: list[_Row] = []
    for key in sorted(groups):
        files = groups[key]
        if len(files) == 1:
            rows.append(files[0])
            rel, path, size, _, reason, fld = files[0]
            if reason is None:
                samples.append(SourceSample(key, (fld,), (path,), (size,), None, size))
                continue
        else:
            files.sort()  # by name, which is by field: they share the key as prefix
            rows += files
        culprit = next((f[0] for f in files if f[4] is not None), None)
        if culprit is None:
            samples.append(SourceSample(key, tuple(f[5] for f in files), tuple(f[1] for f in files),
                                        tuple(f[2] for f in files), None, sum(f[2] for f in files)))
        else:
            note = (f"left out with the rest of sample {display_path(key)!r} because "
                    f"{display_path(culprit)} is bad")
            bad += [(display_path(f[0]), f[4] or note) for f in files]
    return None, samples, bad, rows


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


def _imagefolder_samples(walker: _Walker) -> _Built:
    classes = tuple(sorted(walker.top_dirs))
    index = {c: i for i, c in enumerate(classes)}
    good: list[tuple[tuple[int, str, str], str, str, int, int]] = []
    bad: list[Bad] = []
    rows: list[_Row] = []
    for rel, path, size, mtime, reason in sorted(walker.files):
        top, slash, _ = rel.partition("/")
        if reason is None and not slash:
            reason = "a loose file at the top of an ImageFolder, outside every class folder"
        elif reason is None and not rel.lower().endswith(IMG_EXTENSIONS):
            reason = f"not an image: an ImageFolder holds only {' '.join(IMG_EXTENSIONS)} files"
        rows.append((rel, path, size, mtime, reason))
        if reason is not None:
            bad.append((display_path(rel), reason))
        else:
            good.append((imagefolder_order(rel, index[top]), rel, path, size, mtime))
    good.sort(key=lambda g: g[0])
    samples = [SourceSample(rel, ("image",), (path,), (size,), order[0], size)
               for order, rel, path, size, _ in good]
    return classes, samples, bad, rows


def dataset_source(
    dataset: Any, *, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> Source:
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
    walker = _Walker(root, _selector(include, exclude), True)
    seen: set[str] = set()
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    rows: list[_Row] = []
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
        if reason is None and not _is_utf8(rel):
            reason = "name is not valid UTF-8; rename it"
        seen.add(rel)
        rows.append((f"{label}\0{rel}", path, size, mtime, reason))
        if reason is None:
            samples.append(SourceSample(rel, ("image",), (path,), (size,), label, size))
        else:
            bad.append((display_path(rel), reason))
    return Source(
        root=root, samples=tuple(samples), classes=classes, hidden_ignored=0,
        bad=tuple(sorted(bad)), excluded=walker.excluded,
        digest=_hash("dataset\n" + "\0".join(classes) + "\n", rows),
    )
