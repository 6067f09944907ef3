"""The dataset manifest: frozen dataclasses, JSON in and out, the version gate.

``manifest.json`` is the one file that makes a directory a shardio dataset. It
is written last and atomically (temporary name, fsync, rename), so a manifest
never points at a shard that is missing or partial.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from shardio.errors import ManifestError, ManifestNotFoundError, UnsupportedVersionError
from shardio.format.checksum import CRC32, checksum_function, digest
from shardio.format.frames import FORMAT_NAME, FORMAT_VERSION, FRAME_SIZE, SUPPORTED_VERSIONS

MANIFEST_NAME: Final = "manifest.json"
"""A dataset's manifest, in its folder; written last, so its presence means complete."""
JOURNAL_NAME: Final = ".shardio-pack.json"
"""An unfinished pack's journal, in the dataset's folder until its manifest is written."""
IMG_EXTENSIONS: Final = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""torchvision's ``IMG_EXTENSIONS``, matched case-insensitively against the end of the name."""
BACKENDS: Final = ("records", "lmdb")
MIN_RECORD_BYTES: Final = FRAME_SIZE + 8
"""Bytes every record occupies in its shard file at least, in every backend and version: its
frame, plus an 8-byte index offset (``records``) or its 8-byte key (``lmdb``). A shard of
``n`` bytes holds at most ``n // MIN_RECORD_BYTES`` records, which bounds what a reader
allocates for a manifest's counts before any shard is opened. Format v3 records are columns
of blocks: a record takes at least its key's 4-byte offset (``shardfile3.MIN_RECORD_BYTES``)."""
MIN_RECORD_BYTES_V3: Final = 4


@dataclass(frozen=True)
class ShardInfo:
    """One shard file as the manifest records it."""

    name: str
    num_samples: int
    first_index: int
    num_bytes: int
    checksum: str
    """``"<checksum>:<8 hex digits>"`` of the whole file: ``crc32`` (format v1) or ``crc32c``
    (v2, also what the shard's records are checked with)."""
    keys_crc32: int | None = None
    """CRC-32 of the shard's key block (msgpack array of its keys, as both backends store it):
    readers check it on open, so a shard file exchanged for another of the same size is
    refused instead of read as the wrong samples. ``None`` in manifests written before it."""

    def __post_init__(self) -> None:
        # JSON gives any type: a count that is a string or a float fails here, as a malformed
        # manifest, never later as an untyped comparison inside a reader
        for name, kind in (("name", str), ("num_samples", int), ("first_index", int),
                           ("num_bytes", int), ("checksum", str), ("keys_crc32", int)):
            value = getattr(self, name)
            if value is None and name == "keys_crc32":
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"shard {name} is {value!r}, not {kind.__name__}")
        # readers join the name to the dataset's folder or URL: one that climbs out of it
        # would read another dataset's file as this one's
        if any(c in self.name for c in "/\\\0") or self.name in ("", ".", ".."):
            raise ValueError(f"shard name {self.name!r} is not a plain file name in the "
                             "dataset folder")


@dataclass(frozen=True)
class SkippedFile:
    """An input file that ``pack --skip-bad`` left out, and why."""

    path: str
    reason: str


def _known(kind: type, entry: Any) -> Any:
    """``entry``'s members that ``kind`` has: within a format version a later shardio may add
    optional members (docs/format.md, section 7), which this one ignores; a missing
    required member still fails."""
    if not isinstance(entry, Mapping):
        return entry  # the caller's ** raises TypeError: a malformed manifest
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in entry.items() if k in names}


IMAGEFOLDER: Final = "imagefolder"
CLASS_FOLDERS: Final = "classfolders"
GENERIC: Final = "generic"
CLASS_FOLDERS_OPTION: Final = "class_folders"
"""The ``options`` key a class-folder pack sets (``pack(class_folders=True)``)."""


@dataclass(frozen=True)
class Manifest:
    """What a dataset directory holds: counts, fields, classes, options and its shards."""

    backend: str
    codec: str
    num_samples: int
    num_bytes: int
    fields: tuple[str, ...]
    shards: tuple[ShardInfo, ...]
    classes: tuple[str, ...] | None = None
    class_to_idx: Mapping[str, int] | None = None
    seed: int | None = None
    shuffle: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)
    input_bytes: int = 0
    skipped: tuple[SkippedFile, ...] = ()
    shardio_version: str = ""
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    @property
    def is_labelled(self) -> bool:
        """Whether samples carry a ``label`` field indexing a ``classes`` list."""
        return self.classes is not None

    @property
    def layout(self) -> str:
        """What was packed: ``"imagefolder"`` (fields ``image`` and ``label``),
        ``"classfolders"`` (generic fields and a ``label``) or ``"generic"``."""
        if self.classes is None:
            return GENERIC
        if self.options.get(CLASS_FOLDERS_OPTION) or "image" not in self.fields:
            return CLASS_FOLDERS
        return IMAGEFOLDER

    @property
    def block_records(self) -> int | None:
        """v3: records in each block of every shard (the last block of a shard may hold
        fewer), as the writer's options say; None: not known (v1/v2, or merged datasets
        whose inputs differ). A reading plan cuts its blocks at multiples of it."""
        given = self.options.get("block_records")
        if self.version < 3 or type(given) is not int or given < 1:
            return None
        return given

    @property
    def is_imagefolder(self) -> bool:
        """Whether samples are an ImageFolder's: an ``image`` and its ``label``."""
        return self.layout == IMAGEFOLDER

    def to_json(self) -> dict[str, Any]:
        """The manifest as the JSON object written to ``manifest.json``."""
        out = asdict(self)
        out["fields"] = list(self.fields)
        out["classes"] = None if self.classes is None else list(self.classes)
        out["class_to_idx"] = None if self.class_to_idx is None else dict(self.class_to_idx)
        order = ["format", "version", "shardio_version", "backend", "codec", "num_samples",
                 "num_bytes", "input_bytes", "fields", "classes", "class_to_idx", "seed",
                 "shuffle", "options", "skipped", "shards"]
        return {key: out[key] for key in order}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, path: str = MANIFEST_NAME) -> Manifest:
        """Build a manifest from parsed JSON, refusing unknown formats and versions."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT_NAME:
            raise ManifestError(
                f"{path}: not a shardio manifest (format is {data.get('format')!r} "
                f"where {FORMAT_NAME!r} was expected)" if isinstance(data, Mapping)
                else f"{path}: not a shardio manifest (top level is not an object)",
                path=path,
            )
        version = data.get("version")
        if version not in SUPPORTED_VERSIONS:
            raise UnsupportedVersionError(
                f"{path}: format version {version!r} is not supported by this shardio "
                f"(supports {sorted(SUPPORTED_VERSIONS)}); upgrade shardio to read it",
                path=path,
            )
        try:
            backend = str(data["backend"])
            if backend not in BACKENDS:
                raise ManifestError(f"{path}: unknown backend {backend!r}", path=path)
            shards = tuple(ShardInfo(**_known(ShardInfo, s)) for s in data["shards"])
            classes = data.get("classes")
            class_to_idx = data.get("class_to_idx")
            manifest = cls(
                backend=backend,
                codec=str(data["codec"]),
                num_samples=int(data["num_samples"]),
                num_bytes=int(data["num_bytes"]),
                fields=tuple(data["fields"]),
                shards=shards,
                classes=None if classes is None else tuple(classes),
                class_to_idx=None if class_to_idx is None else dict(class_to_idx),
                seed=data.get("seed"),
                shuffle=bool(data.get("shuffle", True)),
                options=dict(data.get("options") or {}),
                input_bytes=int(data.get("input_bytes", 0)),
                skipped=tuple(SkippedFile(**_known(SkippedFile, s))
                              for s in data.get("skipped") or ()),
                shardio_version=str(data.get("shardio_version", "")),
                format=FORMAT_NAME,
                version=int(version),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"{path}: malformed manifest ({exc!r})", path=path) from exc
        manifest.check_consistency(path)
        return manifest

    def check_consistency(self, path: str = MANIFEST_NAME) -> None:
        """Refuse a manifest whose shard counts and first indices do not add up, or whose
        counts exceed what its shards' bytes can hold: a reader plans (and allocates for)
        every sample before it opens a shard, so a count is bounded before it is trusted."""
        expected = 0
        for shard in self.shards:
            if shard.first_index != expected or shard.num_samples < 0:
                raise ManifestError(
                    f"{path}: shard {shard.name} starts at sample {shard.first_index}, "
                    f"expected {expected}; the manifest is damaged",
                    path=path,
                )
            check_shard_count(shard, shard.num_bytes, path, self.version)
            expected += shard.num_samples
        if expected != self.num_samples:
            raise ManifestError(
                f"{path}: shards hold {expected} samples but num_samples is "
                f"{self.num_samples}; the manifest is damaged",
                path=path,
            )

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        """Samples per shard, in shard order."""
        return tuple(s.num_samples for s in self.shards)


def check_shard_count(shard: ShardInfo, size: int, path: str, version: int = FORMAT_VERSION
                      ) -> None:
    """Refuse ``shard``'s sample count where a file of ``size`` bytes cannot hold it.

    Raises:
        ManifestError: naming the manifest ``path`` and the shard.
    """
    least = MIN_RECORD_BYTES_V3 if version >= 3 else MIN_RECORD_BYTES
    if shard.num_bytes < 0 or shard.num_samples > max(size, 0) // least:
        raise ManifestError(
            f"{path}: shard {shard.name} is said to hold {shard.num_samples} samples in "
            f"{size} bytes, but a record takes at least {least} bytes, so it can "
            f"hold {max(size, 0) // least} at most; the manifest is damaged or "
            "forged: restore it from a copy or re-pack the dataset",
            path=path,
        )


CHECKSUM_CHUNK_BYTES: Final = 8 << 20


def file_checksum(
    path: str | os.PathLike[str], name: str = CRC32, *,
    on_chunk: Callable[[int], object] | None = None,
) -> str:
    """``"<name>:<8 hex>"`` of a whole file, the form ``ShardInfo.checksum`` takes."""
    crc = 0
    compute = checksum_function(name)
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(CHECKSUM_CHUNK_BYTES):
            crc = compute(chunk, crc)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return digest(name, crc)


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """The manifest file of a dataset directory (or the file itself if given)."""
    p = Path(path)
    return p if p.name == MANIFEST_NAME and not p.is_dir() else p / MANIFEST_NAME


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and validate the manifest of the dataset at ``path``.

    Raises:
        ManifestNotFoundError: ``path`` has no manifest.json.
        ManifestError: the manifest is not valid JSON or not a shardio manifest.
        UnsupportedVersionError: it was written by an unknown format version.
    """
    mpath = manifest_path(path)
    try:
        data = mpath.read_bytes()
    except FileNotFoundError as exc:
        raise ManifestNotFoundError(
            f"{mpath.parent}: no {MANIFEST_NAME} here, so this is not a shardio dataset "
            f"(or its pack did not finish). Make one with `shardio pack SRC {mpath.parent}`, "
            f"or finish an interrupted pack with `shardio pack --resume`.",
            path=str(mpath),
        ) from exc
    manifest = parse_manifest(data, path=str(mpath))
    for shard in manifest.shards:
        # the files are at hand: bound each count by the bytes really there too, so a manifest
        # that overstates sizes and counts alike is refused before a plan is allocated for it
        # (a missing or resized shard is the reader's and verify's to report)
        try:
            size = (mpath.parent / shard.name).stat().st_size
        except (OSError, ValueError):
            continue
        check_shard_count(shard, size, str(mpath), manifest.version)
    return manifest


def parse_manifest(data: bytes, *, path: str) -> Manifest:
    """The manifest whose ``manifest.json`` holds ``data``; ``path`` names it in errors.

    Raises:
        ManifestError: ``data`` is not UTF-8 JSON (nesting too deep for the parser and the
            constants ``NaN`` and ``Infinity`` included), or not a shardio manifest.
        UnsupportedVersionError: it was written by an unknown format version.
    """
    try:
        parsed = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ManifestError(f"{path}: not valid JSON ({type(exc).__name__}: {exc}); the "
                            "manifest is damaged, re-pack the dataset", path=path) from exc
    return Manifest.from_json(parsed, path=path)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a manifest holds")


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically: temporary file, fsync, rename, fsync the folder."""
    target = Path(directory) / MANIFEST_NAME
    tmp = target.with_name(f".{MANIFEST_NAME}.tmp")
    data = json.dumps(manifest.to_json(), indent=1, ensure_ascii=False) + "\n"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    fsync_dir(target.parent)
    return target


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename inside ``directory`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

