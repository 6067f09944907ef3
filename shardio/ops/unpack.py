"""``unpack``: a dataset back into the tree it was packed from, byte for byte.

It owns the sample naming rules in reverse (an ImageFolder sample becomes
``DEST/<key>`` from its ``image`` field; a generic sample becomes one
``DEST/<key>.<field>`` per field, or ``DEST/<key>`` for the field ``""``) and
the safety of DEST. Keys and field names are checked twice: all of them,
from the shards' key blocks and the manifest, before the first byte is
written (so a bad dataset usually leaves DEST untouched); and each record's
own ``__key__`` and fields again where its files are written, since those
are the values acted on: a record that disagrees with its key block or the
manifest is refused, and every final path must resolve inside DEST and is
created afresh with ``O_NOFOLLOW | O_EXCL`` (never written through an
existing link or file). A key that is absolute, has a drive, climbs with
``..`` or would land outside DEST through a symlink already there is refused.
Reads through ``shardio.reading.reader``; torch-free.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any, Final

import numpy as np
from tqdm import tqdm

from shardio.errors import OutputExistsError, ShardCorruptError, UnsafeKeyError
from shardio.format.manifest import (
    CLASS_FOLDERS,
    CLASS_FOLDERS_OPTION,
    GENERIC,
    IMAGEFOLDER,
    Manifest,
)
from shardio.format.record import INDEX_FIELD, KEY_FIELD
from shardio.reading.reader import DatasetReader, open_dataset
from shardio.storage.options import RemoteOptions

IMAGE_FIELD: Final = "image"
RESERVED_FIELDS: Final = frozenset({KEY_FIELD, INDEX_FIELD})
_SEPARATORS: Final = re.compile(r"[/\\]")
"""Path separators where a name must be a path on any system (tar members, Windows)."""
_POSIX_NAMES: Final = os.name != "nt"
"""Where a file name may hold ``\\`` and ``:``, as Linux and macOS file names do."""
_WRITE_FLAGS: Final = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
)


@dataclass(frozen=True)
class UnpackSummary:
    """What ``unpack`` wrote."""

    num_samples: int
    num_files: int
    num_bytes: int
    seconds: float


def field_bytes(value: Any) -> bytes:
    """The file content for one field value.

    Bytes are written unchanged (everything ``shardio pack`` stores), str as
    UTF-8, numpy arrays in ``.npy`` format and other values as JSON, as the
    WebDataset convention writes ``.cls``/``.json`` files.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.ndarray):
        out = io.BytesIO()
        np.save(out, value, allow_pickle=False)
        return out.getvalue()
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def sample_files(sample: Mapping[str, Any], *, layout: str) -> Iterator[tuple[str, Any]]:
    """``(relative POSIX path, value)`` of every file one sample unpacks to.

    ``layout`` is the dataset's (``unpack_layout``): an ImageFolder sample is its image
    at its key; the ``label`` of a class-folder pack is its folder, not a file.
    """
    key = str(sample[KEY_FIELD])
    if layout == IMAGEFOLDER:
        yield key, sample[IMAGE_FIELD]
        return
    for name, value in sample.items():
        if name not in RESERVED_FIELDS and not (layout == CLASS_FOLDERS and name == "label"):
            yield (f"{key}.{name}" if name else key), value


def unpack_layout(manifest: Manifest) -> str:
    """How samples become files: ``Manifest.layout``, except that labels are written as
    ``.label`` files unless the pack came from class folders (``options.class_folders``),
    whose folders the labels are (a merge with ``--prefix-keys`` moved the keys)."""
    layout = manifest.layout
    if layout == CLASS_FOLDERS and not manifest.options.get(CLASS_FOLDERS_OPTION):
        return GENERIC
    return layout


def check_field(name: str, *, portable: bool = False) -> str | None:
    """Why field ``name`` is unsafe as a file-name suffix, or ``None`` if it is safe.

    ``portable``: by the rules of every system (a tar member's), not only this one's.
    """
    if ("/" in name) if _POSIX_NAMES and not portable else _SEPARATORS.search(name):
        return "contains a path separator, so it would write into another folder"
    if "\x00" in name:
        return "contains a NUL character"
    return None


def check_key(key: str, *, portable: bool = False) -> str | None:
    """Why ``key`` is unsafe to use as a relative path under DEST, or ``None`` if it is safe.

    ``portable``: by the rules of every system (a tar member's), not only this one's: on
    Linux and macOS ``\\`` and ``C:`` are parts of a file name, as ``pack`` took them.
    """
    if not key:
        return "is empty"
    if "\x00" in key:
        return "contains a NUL character"
    strict = portable or not _POSIX_NAMES
    if key.startswith("/") or (strict and PureWindowsPath(key).anchor):
        return "is an absolute path or has a drive"
    parts = _SEPARATORS.split(key) if strict else key.split("/")
    if ".." in parts:
        return "contains a '..' component"
    if "" in parts or "." in parts:
        return "has an empty or '.' path component"
    return None


def unpack(
    path: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool = False,
    remote: RemoteOptions | None = None,
) -> UnpackSummary:
    """Restore the files a dataset was packed from into ``dest``.

    Args:
        path: dataset folder (or its manifest.json), or its URL.
        dest: local folder to write into; created if absent.
        overwrite: replace files that already exist in ``dest``.
        progress: show a progress bar on stderr.
        remote: how a URL is reached and cached (``RemoteOptions``).

    Raises:
        UnsafeKeyError: a key would write outside ``dest``; nothing was written.
        OutputExistsError: a file to write already exists and ``overwrite`` is
            false; nothing was written.
    """
    start = time.perf_counter()
    root = Path(dest)
    with open_dataset(path, remote=remote) as reader:
        manifest = reader.manifest
        layout = unpack_layout(manifest)
        planned = _planned_paths(manifest, reader.keys(), str(path), layout=layout)
        if root.is_dir() and any(root.iterdir()):
            _check_existing(root, planned, overwrite=overwrite, dataset=str(path))
        else:
            for _ in planned:
                pass
        root.mkdir(parents=True, exist_ok=True)
        files = _DestFiles(root, overwrite=overwrite)
        num_bytes = 0
        with tqdm(total=len(reader), disable=not progress, unit=" samples", desc="unpack",
                  leave=False) as bar:
            for sample, where in _checked_samples(reader, layout=layout):
                for rel, value in sample_files(sample, layout=layout):
                    num_bytes += files.write(rel, field_bytes(value), where)
                bar.update(1)
        return UnpackSummary(len(reader), files.count, num_bytes, time.perf_counter() - start)


def _checked_samples(
    reader: DatasetReader, *, layout: str
) -> Iterator[tuple[dict[str, Any], str]]:
    """Every sample with where it came from, once its own key and fields are checked.

    The names planned before writing came from the key blocks and the
    manifest; the files are named from each record, so the record must agree
    with both, and its key and field names must be safe in their own right.
    """
    manifest = reader.manifest
    fields = frozenset(manifest.fields) - RESERVED_FIELDS
    for number in range(len(manifest.shards)):
        shard = reader.shard(number)
        keys = shard.keys()
        for record, sample in enumerate(reader.iter_shard(number)):
            key = sample.get(KEY_FIELD)
            where = f"{shard.path}: record {record} (sample {sample[INDEX_FIELD]}, key {key!r})"
            why = None
            if key != keys[record]:
                why = f"its key differs from the key block's {keys[record]!r}"
            elif not isinstance(key, str) or check_key(key) is not None:
                why = f"its key {check_key(key) if isinstance(key, str) else 'is not a str'}"
            names = [name for name in sample if name not in RESERVED_FIELDS]
            unknown = sorted(set(names) - fields)
            if why is None and unknown:
                why = f"it has field(s) {unknown} that the manifest does not list"
            if why is None and layout == IMAGEFOLDER and IMAGE_FIELD not in sample:
                why = f"it has no {IMAGE_FIELD!r} field although the dataset has classes"
            if why is None and layout == CLASS_FOLDERS:
                why = _folder_disagrees(sample, manifest.classes or ())
            for name in names:
                if why is None and check_field(name) is not None:
                    why = f"its field name {name!r} {check_field(name)}"
            if why is not None:
                raise ShardCorruptError(
                    f"{where}: refusing to unpack: {why}. The shard disagrees with itself or "
                    "its manifest, so the files it names cannot be trusted; files already "
                    "written stay inside the destination. Run `shardio verify` on the dataset",
                    path=shard.path, record=record,
                )
            yield sample, where
        reader.close_shard(number)


class _DestFiles:
    """Creates files under DEST, checking each final path where it is written."""

    def __init__(self, root: Path, *, overwrite: bool) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.overwrite = overwrite
        self.count = 0
        self._safe_dirs: set[str] = {""}
        # O_EXCL finds two samples naming one file; replacing old files it cannot, so
        # with overwrite the paths written so far are kept (about 100 bytes a file)
        self._written: set[str] | None = set() if overwrite else None

    def _inside(self, path: str | os.PathLike[str]) -> bool:
        real = os.path.realpath(path)
        return real == self.real_root or real.startswith(self.real_root.rstrip(os.sep) + os.sep)

    def write(self, rel: str, data: bytes, where: str) -> int:
        """Create ``DEST/rel`` holding ``data``; returns its size.

        Raises:
            UnsafeKeyError: ``rel`` would resolve outside DEST (``..``, an
                absolute path, or a symlink already in DEST that points out).
            OutputExistsError: the file exists (without ``overwrite``), for
                example because two samples name the same file.
        """
        why = check_key(rel)
        parent = os.path.dirname(rel)
        if why is None and parent not in self._safe_dirs:
            # realpath resolves the symlinks that exist and keeps the rest, which
            # check_key has already cleared of "..", so "inside" is decided here
            if not self._inside(self.root / parent):
                why = "would be written through a symlink that points outside the destination"
            else:
                os.makedirs(self.root / parent, exist_ok=True)
                if not self._inside(self.root / parent):
                    why = "would be written through a symlink that points outside the destination"
                else:
                    self._safe_dirs.add(parent)
        if why is not None:
            raise UnsafeKeyError(
                f"{where}: refusing to write {rel!r}, which {why}; nothing was written "
                f"outside {self.root}",
                path=self.root,
            )
        target = self.root / rel
        if self._written is not None:
            if rel not in self._written and os.path.lexists(target) and not target.is_dir():
                target.unlink()  # replace the entry itself, never write through a link in DEST
            self._written.add(rel)
        try:
            fd = os.open(target, _WRITE_FLAGS, 0o666)
        except FileExistsError as exc:
            raise OutputExistsError(
                f"{where}: {target} already exists; it is a folder, or another sample of "
                "this dataset names the same file. Files already written stay",
                path=target,
            ) from exc
        with open(fd, "wb") as fh:
            fh.write(data)
        self.count += 1
        return len(data)


def _folder_disagrees(sample: Mapping[str, Any], classes: Sequence[str]) -> str | None:
    """Why a class-folder sample's label is not its folder (which unpacking would keep)."""
    label = sample.get("label")
    top = str(sample[KEY_FIELD]).partition("/")[0]
    if type(label) is not int or not 0 <= label < len(classes):
        return f"its label {label!r} is not an index into the dataset's {len(classes)} classes"
    if classes[label] != top:
        return (f"its label {label} is class {classes[label]!r}, but its key is in folder "
                f"{top!r}, so the restored tree would label it otherwise")
    return None


def _planned_paths(
    manifest: Manifest, keys: Iterator[str], dataset: str, *, layout: str
) -> Iterator[str]:
    """Every relative path unpack may write; raises on the first unsafe key or field."""
    fields = [f for f in manifest.fields if f not in RESERVED_FIELDS]
    for name in fields:
        why = check_field(name)
        if why is not None:
            raise UnsafeKeyError(
                f"{dataset}: field name {name!r} {why}; nothing was written. This dataset "
                "was not made by `shardio pack`; read it with the Python API instead",
                path=dataset,
            )
    if layout == CLASS_FOLDERS:
        fields = [f for f in fields if f != "label"]
    suffixes = [""] if layout == IMAGEFOLDER else [f".{f}" if f else "" for f in fields]
    for index, key in enumerate(keys):
        why = check_key(key)
        if why is not None:
            raise UnsafeKeyError(
                f"{dataset}: sample {index} has key {key!r}, which {why}; unpacking it could "
                "write outside the destination, so nothing was written. "
                + ("The dataset was not made by `shardio pack` or was altered" if _POSIX_NAMES
                   else "Names packed on Linux or macOS may hold '\\' or 'C:'; unpack there")
                + "; inspect it with `shardio ls`",
                path=dataset, record=index,
            )
        for suffix in suffixes:
            yield key + suffix


def _check_existing(
    root: Path, relpaths: Iterator[str], *, overwrite: bool, dataset: str
) -> None:
    """Refuse paths that escape ``root`` through symlinks in it, and existing files."""
    real_root = os.path.realpath(root)
    inside = (real_root, real_root.rstrip(os.sep) + os.sep)
    resolved: dict[str, bool] = {}
    existing: list[str] = []
    for rel in relpaths:
        parent = os.path.dirname(rel)
        ok = resolved.get(parent)
        if ok is None:
            real = os.path.realpath(root / parent)
            ok = resolved[parent] = real == inside[0] or real.startswith(inside[1])
        target = root / rel
        if ok and target.is_symlink():
            real = os.path.realpath(target)
            ok = real.startswith(inside[1])
        if not ok:
            raise UnsafeKeyError(
                f"{dataset}: {rel!r} would be written through a symlink in {root} that "
                f"points outside it (to {os.path.realpath(target)}); nothing was written. "
                "Remove the symlink or unpack into an empty folder",
                path=dataset,
            )
        if not overwrite and os.path.lexists(target):
            existing.append(rel)
    if existing:
        raise OutputExistsError(
            f"{root}: {len(existing)} file(s) to unpack already exist (e.g. {existing[0]!r}); "
            "nothing was written. Unpack into an empty folder or pass --overwrite",
            path=root,
        )


DEFAULT_TAR_SHARD_BYTES: Final = 1 << 30
"""Tar shards ``unpack_webdataset`` writes roll beyond this many bytes (WebDataset's usual size)."""


def webdataset_members(sample: Mapping[str, Any], *, layout: str) -> list[tuple[str, bytes]]:
    """The tar members of one sample, named so that ``webdataset.WebDataset`` reads it back.

    WebDataset keys a member by its name up to the first dot of the last component,
    so an ImageFolder sample (key ``cat/001.jpg``) becomes ``cat/001.jpg`` and
    ``cat/001.cls`` (its label); any other sample one ``<key>.<field>`` per field,
    its ``label`` included (as text, ``.label``).

    Raises:
        UnsafeKeyError: the key or a field cannot be named so (a dot in the key's last
            component, a field without a name), or would climb out (``..``, absolute).
    """
    key = str(sample[KEY_FIELD])
    _, dot, ext = key.rpartition("/")[2].partition(".")
    if layout == IMAGEFOLDER and set(sample) - RESERVED_FIELDS == {IMAGE_FIELD, "label"}:
        base = key[:len(key) - len(ext) - 1] if dot else key
        named = [(f"{base}.{ext.lower() or IMAGE_FIELD}", sample[IMAGE_FIELD]),
                 (f"{base}.cls", sample["label"])]
        dot = ""  # the image's extension, which becomes its field
    else:
        named = [(f"{key}.{name}", value) for name, value in sample.items()
                 if name not in RESERVED_FIELDS]
    why = check_key(key, portable=True) or (
        "has a dot in its last component, which WebDataset would split at" if dot else None)
    for name, _ in named:
        if why is None and (name.endswith(".") or check_field(name.rpartition(".")[2],
                                                              portable=True)):
            why = f"has a field that cannot be a member name ({name!r})"
    if why is not None:
        raise UnsafeKeyError(f"sample {key!r}: its key {why}; it cannot be written as a "
                             "WebDataset sample, and no further shard was written",
                             path=key)
    return [(name, field_bytes(value)) for name, value in named]


def unpack_webdataset(
    path: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    max_shard_bytes: int = DEFAULT_TAR_SHARD_BYTES,
    overwrite: bool = False,
    progress: bool = False,
    remote: RemoteOptions | None = None,
) -> UnpackSummary:
    """Write the dataset at ``path`` as WebDataset tar shards ``dest/shard-000000.tar``, ….

    Samples keep the dataset's order; ``webdataset.WebDataset`` reads them back
    with the same keys and bytes (``webdataset_members`` says how each is named).
    Members are deterministic (mtime 0, mode 0444, no owner), so the tars are too.

    Args:
        path: dataset folder (or its manifest.json), or its URL.
        dest: local folder for the tars; created if absent.
        max_shard_bytes: start a new tar beyond this size (a larger sample gets its own).
        overwrite: replace tars already in ``dest``.
        progress: show a progress bar on stderr.
        remote: how a URL is reached and cached (``RemoteOptions``).

    Raises:
        OutputExistsError: ``dest`` holds files and not ``overwrite``.
        UnsafeKeyError: a sample cannot be named as WebDataset members.
    """
    start = time.perf_counter()
    root = Path(dest)
    if root.is_dir() and any(root.iterdir()) and not overwrite:
        raise OutputExistsError(f"{root}: the folder is not empty; write the tars into an "
                                "empty folder or pass --overwrite", path=root)
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("shard-*.tar"):  # with overwrite: no tar of an earlier export stays
        old.unlink()
    files = num_bytes = shard = size = 0
    tar: tarfile.TarFile | None = None
    with open_dataset(path, remote=remote) as reader, tqdm(
            total=len(reader), disable=not progress, unit=" samples", desc="unpack",
            leave=False) as bar:
        layout = unpack_layout(reader.manifest)
        try:
            for sample, _ in _checked_samples(reader, layout=layout):
                members = webdataset_members(sample, layout=layout)
                grows = sum(len(data) + 1024 for _, data in members)
                if tar is not None and size + grows > max_shard_bytes:
                    _close_tar(tar, root, shard)
                    tar, shard, size = None, shard + 1, 0
                if tar is None:
                    tar = tarfile.open(  # noqa: SIM115  # open across samples until full
                        root / f".shard-{shard:06d}.tar.tmp", "w", format=tarfile.PAX_FORMAT)
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size, info.mode, info.mtime = len(data), 0o444, 0
                    tar.addfile(info, io.BytesIO(data))
                    num_bytes += len(data)
                files += len(members)
                size += grows
                bar.update(1)
            if tar is not None:
                _close_tar(tar, root, shard)
                tar = None
        finally:
            if tar is not None:
                tar.close()
                os.unlink(root / f".shard-{shard:06d}.tar.tmp")
        return UnpackSummary(len(reader), files, num_bytes, time.perf_counter() - start)


def _close_tar(tar: tarfile.TarFile, root: Path, shard: int) -> None:
    tar.close()
    os.replace(root / f".shard-{shard:06d}.tar.tmp", root / f"shard-{shard:06d}.tar")
