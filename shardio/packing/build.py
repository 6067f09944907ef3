"""Build one planned shard of a pack: read its files, encode its records, write it durably.

``build_shard`` is the unit of work of ``shardio.pack``: it runs in the main
process, a forked worker or a task on a cluster (``shardio.packing.engines``), touches
only its own shard file, and returns a small ``ShardResult`` (never record
bytes). A shard is written under its hidden temporary name (one per attempt
when tasks may run twice), fsynced, renamed and its folder fsynced before the
result is returned, so whatever the caller journals is on disk, and a repeated
build only renames the same bytes over the same name. A file that turns out bad
while it is read is left out with its whole sample (``skip_bad``), or stops the
shard (``ShardFailure``, and no file is left behind); either way the shard's
bytes depend only on the input and the options. Nothing here imports torch.
"""

from __future__ import annotations

import io
import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from shardio.backends import create_shard, shard_name
from shardio.errors import PackError, RecordEncodeError
from shardio.format.frames import FORMAT_VERSION
from shardio.format.manifest import fsync_dir
from shardio.format.record import KEY_FIELD
from shardio.packing.sources.files import IMG_EXTENSIONS, Bad, SourceSample
from shardio.packing.sources.inputbytes import OpenContainers, is_locator, read_range

REPORT_EVERY: Final = 64
CHANGED: Final = "changed while packing"
"""How the reason for a file that changed or went since the scan begins: SRC is no longer
the one the pack (and its journal) began with, so only a new pack takes it."""
"""Samples between two progress reports of a shard being built."""

Report = Callable[[int, int], None]
"""``report(files, input_bytes)``: that many more input files (and bytes) were handled."""


@dataclass(frozen=True)
class ShardJob:
    """Everything needed to build any shard of one pack; shared by fork, never pickled."""

    stream: Sequence[SourceSample]
    """The samples in pack (post-shuffle) order, from stream position ``offset`` on."""
    plan: Sequence[range] | Mapping[int, range]
    """Stream positions of each shard, from ``shardio.packing.plan.plan_shards``."""
    out: Path
    backend: str
    codec: str
    level: int
    check_images: bool
    """Decode every image with Pillow; without it, images are checked complete only."""
    skip_bad: bool
    labelled: bool
    """ImageFolder samples: fields ``image`` and ``label`` instead of the file fields."""
    offset: int = 0
    """Stream position of ``stream[0]``."""
    base: str | None = None
    """The folder relative sample paths are relative to, when not the working folder."""
    version: int = FORMAT_VERSION
    """The format version the shards are written in."""
    block_records: int | None = None
    """v3: records a block (``WriteOptions.block_records``)."""

    def for_shard(self, number: int) -> ShardJob:
        """This job cut down to shard ``number``: what a task on another machine is sent."""
        span = self.plan[number]
        return replace(self, stream=tuple(self.stream[span.start - self.offset:
                                                      span.stop - self.offset]),
                       plan={number: span}, offset=span.start)


@dataclass(frozen=True)
class ShardResult:
    """A finished shard as the pack journal records it (``num_samples`` may be 0: no file)."""

    number: int
    name: str
    num_samples: int
    num_bytes: int
    checksum: str
    fields: tuple[str, ...]
    """Field names in order of first appearance, ``__key__`` excluded."""
    left_out: tuple[int, ...] = ()
    """Stream positions of the samples left out because a file was bad when read."""
    skipped: tuple[Bad, ...] = ()
    """Their files, with the reasons."""
    keys_crc32: int | None = None
    """CRC-32 of the shard's key block (``ShardInfo.keys_crc32``); absent in older journals."""

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ShardResult:
        """The result from its journal entry (``dataclasses.asdict`` of one, through JSON)."""
        return cls(
            number=int(entry["number"]), name=str(entry["name"]),
            num_samples=int(entry["num_samples"]), num_bytes=int(entry["num_bytes"]),
            checksum=str(entry["checksum"]), fields=tuple(entry["fields"]),
            left_out=tuple(entry["left_out"]),
            skipped=tuple((str(p), str(r)) for p, r in entry["skipped"]),
            keys_crc32=entry.get("keys_crc32"),
        )


@dataclass(frozen=True)
class ShardFailure:
    """A shard that was not written: a file of the sample at ``position`` is bad."""

    number: int
    position: int
    path: str
    reason: str


ShardOutcome = ShardResult | ShardFailure


def _read_rest(fd: int) -> bytes:
    """What follows a first ``read``: a file that grew, or one over the 2 GiB read limit."""
    parts = []
    while chunk := os.read(fd, 1 << 24):
        parts.append(chunk)
    return b"".join(parts)


_ADDRESS: Final = re.compile(r" object at 0x[0-9a-fA-F]+")
_PNG: Final = b"\x89PNG\r\n\x1a\n"
_JPEG_STANDALONE: Final = frozenset({0x01, *range(0xD0, 0xD8)})
"""JPEG markers without a length field: TEM and RST0-7."""
_CUT: Final = "is cut short (a partial download or copy?): "


def is_image_field(name: str) -> bool:
    """Whether field ``name`` holds an image: ``image``, or named by an image extension."""
    return name == "image" or f".{name}".lower().endswith(IMG_EXTENSIONS)


def image_problem(data: bytes | memoryview, *, decode: bool = False) -> str | None:
    """Why image ``data`` is bad, or ``None``; what is said reads after the file's name.

    Without ``decode``, only what costs no decode: a JPEG's segment headers up to its
    image data and its end marker (FFD9) after them (image data cannot hold FFD9, and
    trailing bytes after it are allowed, as decoders allow them); a PNG's chunk chain up
    to IEND; a WebP's RIFF size. Other formats pass. With ``decode``, Pillow decodes it.
    """
    data = bytes(data)
    if data[:2] == b"\xff\xd8":
        problem = _jpeg_problem(data)
    elif data[:8] == _PNG:
        problem = _png_problem(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        size = int.from_bytes(data[4:8], "little") + 8
        problem = None if len(data) >= size else (
            f"{_CUT}its WebP header says {size} bytes, and it has {len(data)}")
    else:
        problem = None
    return problem if problem is not None or not decode else _decode_error(data)


def file_image_problem(path: str, *, decode: bool = False) -> str | None:
    """``image_problem`` of the image file at ``path``, or why it cannot be read."""
    try:
        if is_locator(path):  # a container's member: the range its locator names
            data = read_range(path)
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return image_problem(data, decode=decode)


def _jpeg_problem(data: bytes) -> str | None:
    pos, end = 2, len(data)
    cut = f"{_CUT}its JPEG header ends at byte {end}, before any image data"
    while True:  # segments up to the first scan (SOS): each FF xx, most with a length
        if pos >= end:
            return cut
        if data[pos] != 0xFF:
            return f"is not a JPEG: no segment marker at byte {pos} of its header"
        while pos < end and data[pos] == 0xFF:  # fill bytes may precede a marker
            pos += 1
        if pos >= end:
            continue
        marker = data[pos]
        pos += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker == 0xD9:
            return "is not a complete JPEG: its end marker comes before any image data"
        if pos + 2 > end:
            return cut
        length = int.from_bytes(data[pos:pos + 2], "big")
        if length < 2:
            return f"is not a JPEG: a segment at byte {pos - 2} has length {length}"
        pos += length
        if marker == 0xDA:
            break
    if data.rfind(b"\xff\xd9", min(pos, end)) < 0:
        return f"{_CUT}its JPEG image data has no end marker (FFD9)"
    return None


def _png_problem(data: bytes) -> str | None:
    if len(data) >= 16 and data[12:16] != b"IHDR":
        return "is not a PNG: its first chunk is not IHDR"
    pos, end = 8, len(data)
    while pos + 8 <= end:  # chunks: length, type, data, CRC
        if data[pos + 4:pos + 8] == b"IEND":
            return None
        pos += 12 + int.from_bytes(data[pos:pos + 4], "big")
    return f"{_CUT}its PNG chunks end at byte {end} without the IEND chunk"


def _decode_error(data: bytes) -> str | None:
    from PIL import Image  # only a full check (--check-images, verify --images) needs Pillow

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except Exception as exc:  # Pillow raises a zoo of types for broken images
        # "cannot identify image file <_io.BytesIO object at 0x7f…>": the address would make
        # the reason, and the manifest that lists it, differ from one pack to the next
        text = _ADDRESS.sub(" object", str(exc))
        return f"does not decode as an image ({type(exc).__name__}: {text})"
    return None


Read = tuple["dict[str, Any] | None", int, "str | None"]
"""``(the sample's values, or None with the failing field's position and the reason)``."""


def read_sample(sample: SourceSample, check_images: bool, dir_fd: int | None = None,
                containers: OpenContainers | None = None) -> Read:
    """Read ``sample``'s files into its values, or say which file is bad and why.

    Each file is read with one ``read`` of its scanned size + 1, which also
    finds files that changed since the scan. Relative paths are opened from
    ``dir_fd`` when given, so that errors name them as the scan did. A member
    of a container is read through ``containers`` when given (kept open).
    """
    values: dict[str, Any] = {KEY_FIELD: sample.key}
    paths, sizes = sample.paths, sample.sizes
    for i, name in enumerate(sample.fields):
        size = sizes[i]
        try:
            if is_locator(paths[i]):  # a member of a container (a tar): its byte range
                data = containers.read(paths[i], size) if containers is not None \
                    else read_range(paths[i], size, dir_fd)
            else:
                fd = os.open(paths[i], os.O_RDONLY, dir_fd=dir_fd)
                try:
                    data = os.read(fd, size + 1)
                    if len(data) != size:
                        data += _read_rest(fd)
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return None, i, f"{CHANGED} (gone since the scan)"
        except OSError as exc:
            return None, i, f"cannot be read ({exc.strerror or exc})"
        if len(data) != size:
            return None, i, f"{CHANGED} ({size} bytes when scanned, {len(data)} read)"
        if is_image_field(name):  # always what costs nothing; a decode when asked
            reason = image_problem(data, decode=check_images)
            if reason is not None:
                return None, i, reason
        values[name] = data
    if sample.label is not None:
        values["label"] = sample.label
    return values, -1, None


def temporary_name(name: str, attempt: str = "") -> str:
    """The hidden name shard ``name`` is built under; ``attempt`` makes it one's own."""
    if not attempt:
        return f".{name}.tmp"
    stem, dot, suffix = name.partition(".")
    return f".{stem}-{attempt}{dot}{suffix}.tmp"  # still .shard-*.rec.tmp: resume removes it


def build_shard(
    job: ShardJob, number: int, report: Report | None = None, *, attempt: str = ""
) -> ShardOutcome:
    """Write shard ``number`` of ``job`` and return what the journal and manifest need.

    Without ``job.skip_bad``, the first bad file stops the shard: its partial
    file is removed and a ``ShardFailure`` names the file. On any exception the
    partial file is removed too. Give each ``attempt`` of a build that may run
    twice at once (a task retried on a cluster) its own string: each then
    writes its own temporary file, and the renames put the same bytes in place.
    """
    if job.base is None:
        return _build_shard(job, number, report, attempt, None)
    try:
        base = os.open(job.base, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise PackError(
            f"{job.base}: the working folder the source paths are relative to cannot be opened "
            f"here ({exc.strerror}); give SRC as an absolute path on a filesystem that every "
            "worker sees at the same path", path=job.base) from exc
    try:
        return _build_shard(job, number, report, attempt, base)
    finally:
        os.close(base)


def _build_shard(job: ShardJob, number: int, report: Report | None, attempt: str,
                 dir_fd: int | None) -> ShardOutcome:
    stream, check = job.stream, job.check_images
    name = shard_name(job.backend, number)
    tmp = job.out / temporary_name(name, attempt)
    offset = job.offset
    fields: dict[str, None] = dict.fromkeys(("image", "label")) if job.labelled else {}
    left_out: list[int] = []
    skipped: list[Bad] = []
    keys: list[str] = []
    writer = create_shard(job.backend, tmp, version=job.version, codec=job.codec,
                          level=job.level, block_records=job.block_records)
    files = nbytes = 0
    containers = OpenContainers(dir_fd)
    try:
        for pos in job.plan[number]:
            sample = stream[pos - offset]
            values, failed, reason = read_sample(sample, check, dir_fd, containers)
            if values is not None:
                try:
                    writer.add(values)
                except (RecordEncodeError, struct.error) as exc:
                    values, failed, reason = None, 0, f"cannot be stored as a record ({exc})"
            if values is not None:
                keys.append(sample.key)
                if not job.labelled:
                    fields.update(dict.fromkeys(sample.fields))
                    if sample.label is not None:  # class folders: a label beside the files
                        fields["label"] = None
            elif job.skip_bad:
                left_out.append(pos)
                skipped += sample.bad(failed, reason or "")
            else:
                writer.abort()
                return ShardFailure(number, pos, sample.paths[failed], reason or "")
            files += len(sample.paths)
            nbytes += sample.num_bytes
            if report is not None and files >= REPORT_EVERY:
                report(files, nbytes)
                files = nbytes = 0
        count = len(job.plan[number]) - len(left_out)
        if count == 0:
            writer.abort()
            (job.out / name).unlink(missing_ok=True)
            size, checksum = 0, ""
        else:
            size, checksum = writer.finish()
            os.replace(tmp, job.out / name)
            fsync_dir(job.out)
    except BaseException:
        writer.abort()
        raise
    finally:
        containers.close()
    if report is not None:
        report(files, nbytes)
    return ShardResult(number, name, count, size, checksum, tuple(fields) if count else (),
                       tuple(left_out), tuple(skipped), writer.keys_crc32 if count else None)
