"""``verify``: check a dataset directory against its manifest and report every fault.

It owns the *what is wrong with this dataset* question and answers it whole:
a damaged dataset yields one ``VerifyFault`` per problem (the manifest, a
missing or resized shard, a file checksum, a damaged header, index, key
block or footer, each bad record, and each record that disagrees with its
key block or the manifest: its key, fields the manifest does not list, a
labelled record that is not ``{image, label}``, a key used twice, an image
that is cut short, or with ``images`` one that does not decode) instead of
stopping at the first. Parsing stays where it lives: shards are opened through
``shardio.reading.reader.DatasetReader`` and records checked by
``shardio.format.record.decode_record``. Torch-free; nothing above the reader is imported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shardio.errors import ShardioError
from shardio.format.checksum import name_of
from shardio.format.frames import CODEC_NONE, FRAME
from shardio.format.manifest import (
    CLASS_FOLDERS,
    CLASS_FOLDERS_OPTION,
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    file_checksum,
)
from shardio.format.record import INDEX_FIELD, KEY_FIELD
from shardio.packing.build import image_problem, is_image_field
from shardio.reading.reader import DatasetReader
from shardio.storage.options import RemoteOptions


@dataclass(frozen=True)
class VerifyFault:
    """One problem found: where it is and what to do about it."""

    shard: str
    """The shard file name, or ``manifest.json`` for a manifest problem."""
    record: int | None
    """Record index within the shard, when one record is at fault."""
    offset: int | None
    """Byte offset in the shard file, when known."""
    message: str
    key: str | None = None
    """The sample's key, when one record is at fault and its key is known."""


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` checked and every fault it found; ``ok`` when there are none."""

    ok: bool
    num_shards: int
    num_records: int
    """Records read and decoded (zero for a quick check)."""
    num_bytes: int
    """Shard bytes whose checksum was computed."""
    faults: tuple[VerifyFault, ...]
    quick: bool = False
    seconds: float = 0.0
    images: bool = False
    """Every image was decoded (``verify(images=True)``), not only checked complete."""

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (``shardio verify --json``)."""
        return asdict(self)


def verify(
    path: str | os.PathLike[str], *, quick: bool = False, images: bool = False,
    progress: bool = False, remote: RemoteOptions | None = None,
) -> VerifyReport:
    """Check the dataset at ``path``: manifest, shard sizes, file checksums and every record.

    A remote dataset's shards are downloaded whole into the node cache, one at
    a time (the budget must hold the largest shard), each checked against the
    manifest's file checksum (a mismatch is downloaded once more before it is a
    fault), then checked like local files.

    Args:
        path: dataset folder (or its manifest.json), or its URL.
        quick: check the manifest, shard sizes and whole-file checksums only,
            without reading records.
        images: decode every image with Pillow (slow). Without it, each image is
            checked complete only, as ``shardio pack`` does (its header and end
            marker: ``shardio.packing.build.image_problem``).
        progress: show a progress bar on stderr.
        remote: how a URL is reached and cached (``RemoteOptions``).

    Returns:
        A report listing every fault; ``report.ok`` is true when there is none.
        A missing or unreadable manifest is a fault too, not an exception.
    """
    start = time.perf_counter()
    try:
        reader = DatasetReader(path, verify=True, remote=remote)
    except (ShardioError, OSError) as exc:  # OSError: a file where the folder should be, …
        fault = VerifyFault(MANIFEST_NAME, None, None, str(exc))
        return VerifyReport(False, 0, 0, 0, (fault,), quick, time.perf_counter() - start)
    manifest, root = reader.manifest, reader.root
    faults = list(_manifest_faults(manifest, root))
    num_bytes = 0
    num_records = 0
    seen = _SeenKeys()
    total = manifest.num_bytes if quick else manifest.num_samples
    with (
        tqdm(total=total, unit="B" if quick else " records", unit_scale=quick,
             disable=not progress, desc="verify", leave=False) as bar,
        reader,
    ):
        for number, info in enumerate(manifest.shards):
            try:  # a remote shard: downloaded whole (checked), then checked like a file
                shard_file = reader.shard_file(number)
            except (ShardioError, OSError) as exc:
                faults.append(_fault(info.name, exc))
                continue
            file_faults, hashed = _file_faults(shard_file, info, bar if quick else None)
            faults.extend(file_faults)
            num_bytes += hashed
            # A damaged .rec shard is still read, to name its bad records; liblmdb is never
            # handed an LMDB file known to be damaged (bad pages can kill it by a signal).
            if quick or (file_faults and (not hashed or manifest.backend == "lmdb")):
                reader.close_shard(number)  # a remote shard's cached copy: let it go
                continue
            checked, record_faults = _record_faults(reader, number, manifest, bar, seen,
                                                    images)
            num_records += checked
            faults.extend(record_faults)
            reader.close_shard(number)
    if not quick and not faults and num_records == manifest.num_samples:
        faults.extend(seen.manifest_faults(manifest, root))  # only where every record was seen
    return VerifyReport(
        ok=not faults,
        num_shards=len(manifest.shards),
        num_records=num_records,
        num_bytes=num_bytes,
        faults=tuple(faults),
        quick=quick,
        seconds=time.perf_counter() - start,
        images=images and not quick,
    )


def _manifest_faults(manifest: Manifest, root: Path | str) -> Iterator[VerifyFault]:
    """What ``read_manifest`` does not already refuse: totals, shard names, classes."""
    where = f"{root}/{MANIFEST_NAME}"
    total = sum(s.num_bytes for s in manifest.shards)
    if total != manifest.num_bytes:
        yield VerifyFault(MANIFEST_NAME, None, None,
                          f"{where}: num_bytes is {manifest.num_bytes} but the shards add up to "
                          f"{total}; the manifest is damaged, re-pack the dataset")
    seen: set[str] = set()
    for shard in manifest.shards:
        if shard.name in seen:
            yield VerifyFault(shard.name, None, None,
                              f"{where}: shard {shard.name} is listed twice; the manifest is "
                              "damaged, re-pack the dataset")
        seen.add(shard.name)
    if manifest.classes is not None:
        expected = {name: i for i, name in enumerate(manifest.classes)}
        if dict(manifest.class_to_idx or {}) != expected:
            yield VerifyFault(MANIFEST_NAME, None, None,
                              f"{where}: class_to_idx does not match the order of classes "
                              f"(expected {_abbreviate(expected)}); the manifest is damaged")


def _file_faults(
    path: Path, info: ShardInfo, bar: tqdm[Any] | None
) -> tuple[list[VerifyFault], int]:
    """Existence, size and whole-file checksum of one shard; returns ``(faults, bytes hashed)``.

    A shard of the wrong size is not hashed and its records are not read:
    mapping a truncated file can fault the process, and the size says enough.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [VerifyFault(info.name, None, None,
                            f"{path}: shard {info.name} is missing; restore the file or "
                            "re-pack the dataset")], 0
    if size != info.num_bytes:
        return [VerifyFault(info.name, None, None,
                            f"{path}: shard is {size} bytes but the manifest says "
                            f"{info.num_bytes}; it was truncated or replaced: restore it from "
                            "a copy or re-pack (its records were not checked)")], 0
    try:
        actual = file_checksum(path, name_of(info.checksum),
                               on_chunk=None if bar is None else bar.update)
    except OSError as exc:
        return [VerifyFault(info.name, None, None,
                            f"{path}: cannot read shard ({exc.strerror or exc}); check its "
                            "permissions and the disk")], 0
    if actual != info.checksum:
        return [VerifyFault(info.name, None, None,
                            f"{path}: file checksum is {actual} but the manifest says "
                            f"{info.checksum}; the shard is corrupt: restore it from a copy "
                            "or re-pack")], size
    return [], size


class _SeenKeys:
    """What the records of the whole dataset hold: keys (each used once) and field names."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.fields: set[str] = set()

    def add_keys(self, keys: Sequence[str], info: ShardInfo, path: str) -> Iterator[VerifyFault]:
        """Note one shard's key block; a key some record already has is a fault."""
        for record, key in enumerate(keys):
            if key in self.keys:
                yield VerifyFault(info.name, record, None,
                                  f"{path}: record {record} has key {key!r}, which another "
                                  "record already has; keys must be unique (readers and "
                                  "unpack would confuse them): re-pack the dataset")
            self.keys.add(key)

    def manifest_faults(self, manifest: Manifest, root: Path | str) -> Iterator[VerifyFault]:
        """Fields the manifest lists that no record holds (unlisted ones are record faults)."""
        listed = set(manifest.fields) - {KEY_FIELD}
        unused = sorted(listed - self.fields)
        if unused and manifest.num_samples:
            yield VerifyFault(MANIFEST_NAME, None, None,
                              f"{root}/{MANIFEST_NAME}: fields lists {unused}, which no record "
                              f"holds (records hold {sorted(self.fields)}); the manifest is "
                              "damaged, re-pack the dataset")


def _sample_fault(sample: dict[str, Any], manifest: Manifest, seen: _SeenKeys) -> str | None:
    """What is wrong with a decoded record's fields against the manifest, or ``None``."""
    names = sorted(n for n in sample if n not in (KEY_FIELD, INDEX_FIELD))
    seen.fields.update(names)
    if not isinstance(sample.get(KEY_FIELD), str):
        return f"has key {sample.get(KEY_FIELD)!r}, not a str"
    unlisted = [n for n in names if n not in manifest.fields]
    if unlisted:
        return (f"has field(s) {unlisted} that the manifest does not list (it lists "
                f"{list(manifest.fields)})")
    if manifest.classes is None:
        return None
    label, image = sample.get("label"), sample.get("image")
    folders = manifest.layout == CLASS_FOLDERS
    if not folders and names != ["image", "label"]:
        return f"has fields {names}; a dataset with classes holds exactly ['image', 'label']"
    if folders and "label" not in names:
        return f"has fields {names} and no 'label', although the dataset has classes"
    if not folders and not isinstance(image, (bytes, memoryview)):
        return f"has an image of type {type(image).__name__}, not bytes"
    if type(label) is not int or not 0 <= label < len(manifest.classes):
        return f"has label {label!r}, not an index into the {len(manifest.classes)} classes"
    top = str(sample[KEY_FIELD]).partition("/")[0]
    if manifest.options.get(CLASS_FOLDERS_OPTION) and manifest.classes[label] != top:
        return (f"has label {label} (class {manifest.classes[label]!r}) but its key is in "
                f"folder {top!r}; packed from class folders, the two are one")
    return None


def _image_fault(sample: dict[str, Any], decode: bool) -> str | None:
    """What is wrong with the first bad image field of a record, or ``None``."""
    for name, value in sample.items():
        if isinstance(value, (bytes, memoryview)) and is_image_field(name):
            problem = image_problem(value, decode=decode)
            if problem is not None:
                return (f"field {name!r} {problem}; it was packed so: replace the file and "
                        "re-pack (or pack with --skip-bad to leave it out)")
    return None


def _record_faults(
    reader: DatasetReader, number: int, manifest: Manifest, bar: tqdm[Any], seen: _SeenKeys,
    images: bool,
) -> tuple[int, list[VerifyFault]]:
    """Read every record of shard ``number``; returns ``(records read, faults)``."""
    info = manifest.shards[number]
    faults: list[VerifyFault] = []
    try:
        shard = reader.shard(number)
        keys = shard.keys()
        scan = shard.scan()
    except (ShardioError, OSError) as exc:
        return 0, [_fault(info.name, exc)]
    if len(keys) != shard.num_records:
        faults.append(VerifyFault(info.name, None, None,
                                  f"{shard.path}: key block lists {len(keys)} keys for "
                                  f"{shard.num_records} records; re-pack the dataset"))
    faults.extend(seen.add_keys(keys, info, shard.path))
    checked = 0
    index = getattr(shard, "block_index", None)
    if index is not None:  # v3: block by block
        scan = _block_samples(reader, number, index.firsts, faults, info.name)
    while True:
        try:
            record, framed = next(scan)
        except StopIteration:
            break
        except (ShardioError, OSError) as exc:
            faults.append(_fault(info.name, exc))
            break
        checked += 1
        bar.update(1)
        try:
            sample = (framed if isinstance(framed, dict)
                      else reader.decode(number, record, framed))
        except ShardioError as exc:
            key_note = f" (key {keys[record]!r})" if record < len(keys) else ""
            faults.append(_fault(info.name, exc, note=f"; sample {info.first_index + record}"
                                 f"{key_note}"))
            continue
        why = _sample_fault(sample, manifest, seen)
        if why is None and manifest.codec == "none" and index is None and FRAME.unpack_from(
                framed)[2] != CODEC_NONE:
            why = "is stored compressed although the manifest's codec is 'none'"
        if why is not None:
            why += "; re-pack the dataset"
        else:
            why = _image_fault(sample, images)
        if why is not None:
            key = sample.get(KEY_FIELD)
            faults.append(VerifyFault(info.name, record, shard.offset(record),
                                      f"{shard.path}: record {record} at byte "
                                      f"{shard.offset(record)} (key {key!r}) {why}",
                                      key if isinstance(key, str) else None))
    if checked != info.num_samples:
        faults.append(VerifyFault(info.name, None, None,
                                  f"{shard.path}: read {checked} records but the manifest says "
                                  f"{info.num_samples}; re-pack the dataset"))
    return checked, faults


def _block_samples(reader: DatasetReader, number: int, firsts: list[int],
                   faults: list[VerifyFault], name: str) -> Iterator[tuple[int, Any]]:
    """``(record, sample)`` of a v3 shard, block by block; a block that fails its checks is
    one fault (naming it and its records), and its records are not read."""
    for b in range(len(firsts) - 1):
        try:
            samples = reader.decode_run(number, firsts[b], firsts[b + 1])
        except ShardioError as exc:
            faults.append(_fault(name, exc))
            continue
        yield from enumerate(samples, start=firsts[b])


def _fault(shard: str, exc: BaseException, *, note: str = "") -> VerifyFault:
    record = getattr(exc, "record", None)
    offset = getattr(exc, "offset", None)
    return VerifyFault(shard, record, offset, f"{exc}{note}")


def _abbreviate(mapping: dict[str, int], limit: int = 5) -> str:
    items = [f"{k!r}: {v}" for k, v in list(mapping.items())[:limit]]
    more = len(mapping) - limit
    return "{" + ", ".join(items) + (f", … {more} more" if more > 0 else "") + "}"
