"""``shardio.merge``: several datasets into one, without re-encoding a sample.

Each input's shard files become the output's, in input order and renamed in
sequence (``shard-00000…``): hard-linked when input and output share a
filesystem (no bytes copied; the files are never modified in place, by shardio
or by its readers), copied otherwise, never symlinked. The manifests are
combined: counts and first indices follow the new shard order, fields and
skipped lists are united, and the output's manifest is written last, so an
interrupted merge leaves no dataset. Keys must stay unique: they are read from
the shards' key blocks alone, and a collision is refused unless
``prefix_keys``, which names every sample ``<input folder name>/<key>``. A
record stores its own key, so prefixed shards are rewritten run by run (decoded by
``format.runs`` and written again: field bytes kept, no image decoded).
Nothing here imports torch.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from shardio.backends import ShardFileReader, create_shard, shard_name
from shardio.errors import OutputExistsError, PackError
from shardio.format.frames import LAST_FRAMED_VERSION
from shardio.format.manifest import (
    CLASS_FOLDERS_OPTION,
    Manifest,
    ShardInfo,
    SkippedFile,
    fsync_dir,
    load_manifest,
    write_manifest,
)
from shardio.format.record import KEY_FIELD
from shardio.format.runs import decode_run
from shardio.packing.journal import dataset_entries, dataset_lock
from shardio.reading.reader import DatasetReader
from shardio.storage.location import local_path
from shardio.version import __version__

MAX_LISTED: Final = 5
REWRITE_RECORDS: Final = 256
"""Records of a v1/v2 shard decoded at a time when its keys are rewritten."""
"""Keys named in a refusal; the message gives the count of the rest."""
CROSS_DEVICE: Final = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
"""``os.link`` failures that mean "copy instead": another filesystem, or one without links."""


@dataclass(frozen=True)
class MergeSummary:
    """What a merge did; ``to_json()`` is what ``shardio merge --json`` prints."""

    out: str
    inputs: tuple[str, ...]
    samples: int
    shards: int
    output_bytes: int
    linked: int
    """Shard files hard-linked from an input."""
    copied: int
    """Shard files copied byte for byte (another filesystem, or ``link=False``)."""
    rewritten: int
    """Shard files rewritten with prefixed keys."""
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return asdict(self)


def merge(
    inputs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    prefix_keys: bool = False,
    link: bool = True,
) -> MergeSummary:
    """Build the dataset ``out`` from the datasets ``inputs``, in that order, without re-encoding.

    Args:
        inputs: local dataset folders sharing backend, codec and classes (or all without).
        out: the new dataset's folder; absent or empty.
        prefix_keys: name each sample ``<input folder name>/<key>`` (the inputs'
            folder names must differ); its shards are then rewritten.
        link: hard-link shard files where input and output share a filesystem;
            ``False`` copies them.

    Raises:
        PackError: the inputs differ in backend, codec or classes, keys collide
            (without ``prefix_keys``), or two inputs share a folder name (with it).
        OutputExistsError: ``out`` holds files.
        DatasetLockedError: another writer kept ``out`` (``shardio.packing.journal.dataset_lock``).
        StorageError: an input or ``out`` is a URL.
        ManifestNotFoundError: an input is not a dataset.
    """
    start = time.perf_counter()
    paths = [local_path(p, role="merge input") for p in inputs]
    dest = local_path(out, role="merge output")
    if not paths:
        raise ValueError("merge needs at least one input dataset")
    if dest.exists() and not dest.is_dir():
        raise OutputExistsError(f"{dest}: the merge output is a file; choose a folder that is "
                                "absent or empty", path=dest)
    with dataset_lock(dest, "shardio merge"):  # the inputs are only read: no lock of theirs
        return _merge(paths, dest, prefix_keys=prefix_keys, link=link, start=start)


def _merge(paths: Sequence[Path], dest: Path, *, prefix_keys: bool, link: bool,
           start: float) -> MergeSummary:
    """``merge`` into ``dest``, whose write lock is held."""
    manifests = [load_manifest(p) for p in paths]
    _refuse_mismatch(paths, manifests)
    names = [p.resolve().name for p in paths]
    if prefix_keys and len(set(names)) < len(names):
        raise PackError(
            f"inputs {', '.join(map(str, paths))}: --prefix-keys names samples by their "
            f"input's folder name, and these share one ({names}); rename or move a folder",
            path=paths[0])
    if dataset_entries(dest):
        raise OutputExistsError(
            f"{dest}: the merge output must be absent or an empty folder; choose another, or "
            "remove it (an interrupted merge leaves shard files and no manifest.json)",
            path=dest)
    _refuse_clashes(paths, prefix_keys=prefix_keys)
    created: list[Path] = []
    counts = {"linked": 0, "copied": 0, "rewritten": 0}
    shards: list[ShardInfo] = []
    try:
        for path, manifest, name in zip(paths, manifests, names, strict=True):
            with DatasetReader(path) as reader:
                for number, info in enumerate(manifest.shards):
                    target = dest / shard_name(manifest.backend, len(shards))
                    first = shards[-1].first_index + shards[-1].num_samples if shards else 0
                    if prefix_keys:
                        new = _rewrite(reader.shard(number), target, manifest, f"{name}/",
                                       created, counts)
                        reader.close_shard(number)
                        shards.append(ShardInfo(target.name, info.num_samples, first, *new))
                        continue
                    counts[_place(path / info.name, target, link, created)] += 1
                    shards.append(ShardInfo(target.name, info.num_samples, first,
                                            info.num_bytes, info.checksum, info.keys_crc32))
        fsync_dir(dest)  # every shard's name is durable before the manifest names it
    except BaseException:
        for made in created:  # an error or Ctrl-C leaves the output as it found it
            made.unlink(missing_ok=True)  # (and the lock's release a folder it created)
        raise
    write_manifest(dest, _merged_manifest(manifests, names, shards, prefix_keys))
    return MergeSummary(
        out=str(dest), inputs=tuple(map(str, paths)),
        samples=sum(s.num_samples for s in shards), shards=len(shards),
        output_bytes=sum(s.num_bytes for s in shards), seconds=time.perf_counter() - start,
        **counts)


def _refuse_mismatch(paths: Sequence[Path], manifests: Sequence[Manifest]) -> None:
    """One backend, one codec, one class list and one layout for every input."""
    for what in ("backend", "codec", "classes", "layout"):
        values = [getattr(m, what) for m in manifests]
        if any(v != values[0] for v in values):
            listed = "; ".join(f"{p}: {v!r}" for p, v in zip(paths, values, strict=True))
            why = {"classes": "labels index the classes, so every input must have the same "
                              "class list (or none): re-pack them together",
                   # an ImageFolder's records are {image, label}; a class-folder pack's keep
                   # each file's own fields: readers decode by the dataset's one layout
                   "layout": "a dataset's records have one layout: re-pack them together, "
                             "all with --class-folders or none"}.get(
                what, f"a dataset has one {what}: re-pack the odd ones with --{what} "
                      f"{values[0]}")
            raise PackError(f"the inputs differ in {what} ({listed}); {why}", path=paths[0])
    blocks = [m.version >= 3 for m in manifests]
    if any(blocks) and not all(blocks):
        listed = "; ".join(f"{p}: v{m.version}" for p, m in zip(paths, manifests, strict=True))
        raise PackError(f"the inputs differ in format version ({listed}): a dataset's shards "
                        "are all format v3 or none are; re-pack the older ones with "
                        "--format-version 3", path=paths[0])


def _refuse_clashes(paths: Sequence[Path], *, prefix_keys: bool) -> None:
    """Refuse output keys that repeat, reading the inputs' key blocks only."""
    seen: dict[str, int] = {}
    clashes: list[tuple[str, int]] = []
    for number, path in enumerate(paths):
        prefix = f"{path.resolve().name}/" if prefix_keys else ""
        with DatasetReader(path) as reader:
            for key in reader.keys():  # noqa: SIM118 - key blocks; iterating reads records
                if seen.setdefault(prefix + key, number) != number:
                    clashes.append((prefix + key, number))
    if clashes:
        shown = ", ".join(f"{k!r} (in {paths[seen[k]]} and {paths[n]})"
                          for k, n in clashes[:MAX_LISTED])
        more = f" and {len(clashes) - MAX_LISTED} more" if len(clashes) > MAX_LISTED else ""
        raise PackError(
            f"{len(clashes)} key(s) are in more than one input: {shown}{more}. Keys name "
            "samples and must be unique in a dataset: pass --prefix-keys "
            "(prefix_keys=True) to name samples <input folder name>/<key>, or leave an input "
            "out", path=paths[0])


def _place(src: Path, target: Path, link: bool, created: list[Path]) -> str:
    """Hard-link ``src`` as ``target``, or copy it (to a hidden name, fsynced, renamed)."""
    if link:
        try:
            os.link(src, target)
        except OSError as exc:
            if exc.errno not in CROSS_DEVICE:
                raise
        else:
            created.append(target)
            return "linked"
    tmp = target.with_name(f".{target.name}.tmp")
    created += [tmp, target]
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())
    os.replace(tmp, target)
    return "copied"


def _rewrite(reader: ShardFileReader, target: Path, manifest: Manifest, prefix: str,
             created: list[Path], counts: dict[str, int]) -> tuple[int, str, int]:
    """Write ``reader``'s samples to ``target`` with keys ``prefix + key``: decoded a run at
    a time (a v3 block, or ``REWRITE_RECORDS`` records) and written again as they are (no
    image is decoded), in the shard's format version.

    Returns ``(bytes, checksum, keys_crc32)`` of the new shard.
    """
    tmp = target.with_name(f".{target.name}.tmp")
    created += [tmp, target]
    keys = reader.keys()
    new_keys = [prefix + key for key in keys]
    writer = create_shard(manifest.backend, tmp,
                          version=max(manifest.version, LAST_FRAMED_VERSION), codec=manifest.codec,
                          level=int(manifest.options.get("level", 3)))
    index = getattr(reader, "block_index", None)
    cuts = (index.firsts if index is not None
            else [*range(0, reader.num_records, REWRITE_RECORDS), reader.num_records])
    try:
        for lo, hi in itertools.pairwise(cuts):
            for sample in decode_run(reader.read_run(lo, hi), path=reader.path, first_record=lo,
                                     offset_of=reader.offset, keys=keys):
                sample[KEY_FIELD] = new_keys[lo]
                lo += 1
                writer.add(sample)
        size, checksum = writer.finish()
    except BaseException:
        writer.abort()
        raise
    os.replace(tmp, target)
    counts["rewritten"] += 1
    return size, checksum, writer.keys_crc32


def _merged_manifest(manifests: Sequence[Manifest], names: Sequence[str],
                     shards: Sequence[ShardInfo], prefix_keys: bool) -> Manifest:
    """The inputs' manifests as one: shards in order, fields and skipped files united."""
    first = manifests[0]
    fields: dict[str, None] = {}
    skipped: list[SkippedFile] = []
    for manifest, name in zip(manifests, names, strict=True):
        fields.update(dict.fromkeys(manifest.fields))
        skipped += [SkippedFile(f"{name}/{s.path}", s.reason) if prefix_keys else s
                    for s in manifest.skipped]
    seeds = {m.seed for m in manifests}
    # options every input agrees on, and what the merge was
    options = {k: v for k, v in first.options.items()
               if all(k in m.options and m.options[k] == v for m in manifests)}
    options["merge"] = {"inputs": list(names), "prefix_keys": prefix_keys}
    if prefix_keys:  # keys no longer start with their class folder: labels stay as stored
        options.pop(CLASS_FOLDERS_OPTION, None)
    return Manifest(
        backend=first.backend, codec=first.codec, num_samples=sum(s.num_samples for s in shards),
        num_bytes=sum(s.num_bytes for s in shards), fields=tuple(fields), shards=tuple(shards),
        classes=first.classes, class_to_idx=first.class_to_idx,
        seed=seeds.pop() if len(seeds) == 1 else None, shuffle=all(m.shuffle for m in manifests),
        options=options, input_bytes=sum(m.input_bytes for m in manifests),
        skipped=tuple(sorted(skipped, key=lambda s: (s.path, s.reason))),
        shardio_version=__version__,
        version=max(LAST_FRAMED_VERSION, *(m.version for m in manifests)))
