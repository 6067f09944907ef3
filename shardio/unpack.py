"""``unpack``: a dataset back into the tree it was packed from, byte for byte.

It owns the sample naming rules in reverse (an ImageFolder sample becomes
``DEST/<key>`` from its ``image`` field; a generic sample becomes one
``DEST/<key>.<field>`` per field, or ``DEST/<key>`` for the field ``""``) and
the safety of DEST: every key is checked before the first byte is written,
and a key that is absolute, has a drive, climbs with ``..`` or would land
outside DEST through a symlink already there is refused. Reads through
``shardio.reader``; torch-free.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any, Final

import numpy as np
from tqdm import tqdm

from shardio.errors import OutputExistsError, UnsafeKeyError
from shardio.manifest import Manifest
from shardio.reader import open_dataset
from shardio.record import INDEX_FIELD, KEY_FIELD

IMAGE_FIELD: Final = "image"
RESERVED_FIELDS: Final = frozenset({KEY_FIELD, INDEX_FIELD})
_SEPARATORS: Final = re.compile(r"[/\\]")
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(
    os, "O_BINARY", 0
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


def sample_files(sample: Mapping[str, Any], *, labelled: bool) -> Iterator[tuple[str, Any]]:
    """``(relative POSIX path, value)`` of every file one sample unpacks to."""
    key = str(sample[KEY_FIELD])
    if labelled:
        yield key, sample[IMAGE_FIELD]
        return
    for name, value in sample.items():
        if name not in RESERVED_FIELDS:
            yield (f"{key}.{name}" if name else key), value


def check_key(key: str) -> str | None:
    """Why ``key`` is unsafe to use as a relative path under DEST, or ``None`` if it is safe."""
    if not key:
        return "is empty"
    if "\x00" in key:
        return "contains a NUL character"
    if key.startswith("/") or PureWindowsPath(key).anchor:
        return "is an absolute path or has a drive"
    parts = _SEPARATORS.split(key)
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
) -> UnpackSummary:
    """Restore the files a dataset was packed from into ``dest``.

    Args:
        path: dataset folder (or its manifest.json).
        dest: folder to write into; created if absent.
        overwrite: replace files that already exist in ``dest``.
        progress: show a progress bar on stderr.

    Raises:
        UnsafeKeyError: a key would write outside ``dest``; nothing was written.
        OutputExistsError: a file to write already exists and ``overwrite`` is
            false; nothing was written.
    """
    start = time.perf_counter()
    root = Path(dest)
    with open_dataset(path) as reader:
        manifest = reader.manifest
        labelled = manifest.is_labelled
        planned = _planned_paths(manifest, reader.keys(), str(path), labelled=labelled)
        if root.is_dir() and any(root.iterdir()):
            _check_existing(root, planned, overwrite=overwrite, dataset=str(path))
        else:
            for _ in planned:
                pass
        root.mkdir(parents=True, exist_ok=True)
        made: set[str] = set()
        num_files = num_bytes = 0
        flags = _WRITE_FLAGS | (os.O_TRUNC if overwrite else os.O_EXCL)
        for sample in tqdm(reader, total=len(reader), disable=not progress, unit=" samples",
                           desc="unpack", leave=False):
            for rel, value in sample_files(sample, labelled=labelled):
                parent = os.path.dirname(rel)
                if parent and parent not in made:
                    os.makedirs(root / parent, exist_ok=True)
                    made.add(parent)
                data = field_bytes(value)
                target = root / rel
                if overwrite and target.is_symlink():
                    target.unlink()
                fd = os.open(target, flags, 0o666)
                with open(fd, "wb") as fh:
                    fh.write(data)
                num_files += 1
                num_bytes += len(data)
        return UnpackSummary(len(reader), num_files, num_bytes, time.perf_counter() - start)


def _planned_paths(
    manifest: Manifest, keys: Iterator[str], dataset: str, *, labelled: bool
) -> Iterator[str]:
    """Every relative path unpack may write; raises on the first unsafe key or field."""
    fields = [f for f in manifest.fields if f not in RESERVED_FIELDS]
    for name in fields:
        if _SEPARATORS.search(name) or "\x00" in name:
            raise UnsafeKeyError(
                f"{dataset}: field name {name!r} contains a path separator, so it would "
                "write into another folder; nothing was written. This dataset was not made "
                "by `shardio pack`; read it with the Python API instead",
                path=dataset,
            )
    suffixes = [""] if labelled else [f".{f}" if f else "" for f in fields]
    for index, key in enumerate(keys):
        why = check_key(key)
        if why is not None:
            raise UnsafeKeyError(
                f"{dataset}: sample {index} has key {key!r}, which {why}; unpacking it could "
                "write outside the destination, so nothing was written. The dataset was not "
                "made by `shardio pack` or was altered; inspect it with `shardio ls`",
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
