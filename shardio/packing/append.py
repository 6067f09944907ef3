"""Appending to a dataset: new files packed as new shards after the old ones, then one manifest.

``shardio.pack(..., append=True)`` runs an ordinary pack of the *new* samples
into a hidden folder inside the dataset (``.shardio-append``, ignored by
readers, which take their shards from ``manifest.json`` only), with the pack's
own journal, so a killed append resumes like a killed pack. Only when every new
shard is finished are they renamed into the dataset, continuing its shard
numbering, and the manifest replaced atomically by one naming old and new
shards. Until that rename of ``manifest.json`` the dataset is the old one,
complete and readable; what an interrupted append leaves (the hidden folder,
new shard files no manifest names) is resumed or removed by the next append.
``shardio.pack`` holds the dataset's write lock (``shardio.packing.journal.dataset_lock``)
from before the old manifest is read until the new one is in place, so appends
and other writers of one dataset take turns; readers never wait.

This module decides what may be appended (keys not yet in the dataset, the
same backend and codec, classes that keep every old index) and publishes the
result; ``shardio.pack`` runs the pack in between. Old and new samples are not
mixed across shards: the reader's block shuffle mixes them at read time.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from shardio.backends import shard_name
from shardio.errors import OutputExistsError, PackError, StorageError
from shardio.format.frames import LAST_FRAMED_VERSION
from shardio.format.manifest import (
    CLASS_FOLDERS,
    GENERIC,
    IMAGEFOLDER,
    MANIFEST_NAME,
    Manifest,
    fsync_dir,
    load_manifest,
    write_manifest,
)
from shardio.packing.journal import dataset_entries
from shardio.packing.sources.files import Bad, PackSource, SourceSample, display_path
from shardio.packing.target import LocalTarget, PackTarget
from shardio.packing.writer import DEFAULT_MAX_SHARD_BYTES, WriteOptions
from shardio.reading.reader import DatasetReader
from shardio.storage.location import is_url
from shardio.version import __version__

STAGING_NAME: Final = ".shardio-append"
"""The hidden folder inside the dataset where an append builds its shards."""
MAX_LISTED: Final = 5
"""Keys or classes named in a refusal; the message gives the count of the rest."""

_NUMBERED = re.compile(r"shard-(\d+)\.[a-z]+\Z")


class AppendTarget(LocalTarget):
    """The staging folder of an append: a local pack target that publishes nothing itself.

    The pack's journal lives here as in any pack; its manifest is kept in
    memory (``staged``) for ``AppendJob.publish``, which renames the shards into
    the dataset. A journal of another append (other input or options, or a
    dataset that changed since) is discarded instead of refused: the folder is
    scratch, never part of the dataset.
    """

    def __init__(self, out: Path) -> None:
        super().__init__(out / STAGING_NAME)
        self.staged: Manifest | None = None

    def prepare(self, *, overwrite: bool, resume: bool) -> None:
        """Create the staging folder; what is in it is judged by ``open_journal``."""
        self.staging.mkdir(exist_ok=True)

    def open_journal(self, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The journal of an interrupted append of the same input, or None (folder emptied)."""
        try:
            return super().open_journal(identity)
        except (OutputExistsError, PackError):
            shutil.rmtree(self.staging)
            self.staging.mkdir()
            return None

    def write_manifest(self, manifest: Manifest) -> None:
        """Keep the new shards' manifest for ``AppendJob.publish``; nothing is written."""
        self.staged = manifest

    def finish(self) -> None:
        """Nothing: the journal stays until the shards are published."""


class _Summary(Protocol):
    @property
    def skipped(self) -> tuple[Bad, ...]: ...


S = TypeVar("S", bound=_Summary)


@dataclass(frozen=True)
class AppendJob:
    """An append that passed every check: the new samples, and where they go."""

    out: Path
    base: Manifest
    """The dataset as it was before this append."""
    source: PackSource
    """The samples to pack: keys not in the dataset yet, labels indexing the joint classes."""
    options: WriteOptions
    target: AppendTarget
    existing_skipped: int
    """Samples of SRC left out because their keys are in the dataset (``skip_existing``)."""
    left_skipped: tuple[Bad, ...] = ()
    """Files of SRC the dataset lists as skipped, left out again (without ``retry_skipped``)."""

    def publish(self, summary: S) -> S:
        """Rename the staged shards into the dataset, write its manifest, drop the staging.

        ``summary`` (a ``PackSummary`` of the staged pack) comes back naming the
        dataset, with ``existing_samples`` and ``existing_skipped`` filled in, and the
        files left out as the dataset's skipped ones added to its ``skipped``. The
        manifest lists a file once, packed or skipped: this append's verdict on a file
        replaces the dataset's.
        """
        staged = self.target.staged
        assert staged is not None, "publish before the staged pack finished"
        if load_manifest(self.out) != self.base:  # the write lock keeps shardio's writers out
            raise PackError(
                f"{self.out}: {MANIFEST_NAME} changed while this append ran, by a writer that "
                "does not take the dataset's write lock (an older shardio, a ShardWriter, a "
                "copy); nothing was published. Run the append again (with --skip-existing if "
                "that writer added some of its keys)", path=self.out)
        number = next_shard_number(self.base)
        first = self.base.num_samples
        shards = list(self.base.shards)
        for info in staged.shards:
            name = shard_name(self.base.backend, number)
            os.replace(self.target.staging / info.name, self.out / name)
            shards.append(dataclasses.replace(info, name=name, first_index=first))
            number += 1
            first += info.num_samples
        fsync_dir(self.out)  # the shards' names are durable before a manifest names them
        fields = dict.fromkeys(self.base.fields) | dict.fromkeys(staged.fields)
        judged = {s.path for s in staged.skipped} | {
            display_path(rel) for sample in self.source.samples for rel in sample.rel_paths()}
        classes = staged.classes
        write_manifest(self.out, dataclasses.replace(
            self.base, num_samples=first, num_bytes=sum(s.num_bytes for s in shards),
            fields=tuple(fields), shards=tuple(shards), classes=classes,
            class_to_idx=None if classes is None else {c: i for i, c in enumerate(classes)},
            input_bytes=self.base.input_bytes + staged.input_bytes,
            skipped=tuple(sorted((*(s for s in self.base.skipped if s.path not in judged),
                                  *staged.skipped), key=lambda s: (s.path, s.reason))),
            # the new shards are this writer's format: a version 1 dataset's manifest says 2
            shardio_version=__version__, version=max(self.base.version, LAST_FRAMED_VERSION)))
        shutil.rmtree(self.target.staging)
        return dataclasses.replace(summary, out=str(self.out),  # type: ignore[type-var]
                                   existing_samples=self.base.num_samples,
                                   existing_skipped=self.existing_skipped,
                                   skipped=(*summary.skipped, *self.left_skipped))


def next_shard_number(manifest: Manifest) -> int:
    """The number after the highest of the dataset's shard names (names may have gaps)."""
    numbers = [int(m[1]) for s in manifest.shards if (m := _NUMBERED.match(s.name))]
    return max(numbers, default=len(manifest.shards) - 1) + 1


def dataset_folder(target: PackTarget) -> Path:
    """The local folder of an append's output; a URL is refused, saying what to do instead."""
    if not isinstance(target, LocalTarget):
        raise StorageError(
            f"{target.url}: appending to a dataset at a URL is not supported: the new shards "
            "and the manifest cannot be swapped in as one step there. Append to a local copy "
            "and upload it (shards first, manifest.json last), or pack the new files into a "
            "dataset of their own", path=target.url)
    return target.staging


def pack_choices(target: PackTarget, *, append: bool, imagefolder: bool | None,
                 class_folders: bool, check_images: bool | None,
                 skip_bad: bool | None) -> tuple[bool | None, bool, bool, bool]:
    """``(imagefolder, class_folders, check_images, skip_bad)`` of a pack: what the caller
    left unsaid (None) is, for an append, as the dataset was packed (its manifest says), so
    that a file its pack refused is refused again; otherwise ``check_images`` and
    ``skip_bad`` are off.
    """
    out = dataset_folder(target) if append else None
    if out is None or not (out / MANIFEST_NAME).exists():
        return imagefolder, class_folders, bool(check_images), bool(skip_bad)
    base = load_manifest(out)
    if imagefolder is None and not class_folders:  # SRC read as the dataset's was
        imagefolder, class_folders = base.layout == IMAGEFOLDER, base.layout == CLASS_FOLDERS
    recorded = base.options
    return (imagefolder, class_folders,
            bool(recorded.get("check_images", False) if check_images is None else check_images),
            bool(recorded.get("skip_bad", False) if skip_bad is None else skip_bad))


def settle_interrupted_append(target: PackTarget, *, overwrite: bool, resume: bool) -> None:
    """Before a pack that is not an append: what to do with an interrupted append's folder.

    ``overwrite`` discards it with the dataset (it is scratch); ``resume`` is
    refused with the command that does continue it (``--append``).

    Raises:
        PackError: ``resume`` where an append, not a pack, was interrupted.
    """
    if not isinstance(target, LocalTarget) or not (target.staging / STAGING_NAME).is_dir():
        return
    if overwrite:
        shutil.rmtree(target.staging / STAGING_NAME)
    elif resume:
        raise PackError(
            f"{target.staging}: this is a complete dataset with an interrupted append "
            f"({STAGING_NAME}), not an interrupted pack. Run the append again (the same "
            "command with --append instead of --resume): it continues where it stopped",
            path=target.staging)


def prepare_append(
    target: PackTarget, source: PackSource, options: WriteOptions | None, *, skip_existing: bool,
    retry_skipped: bool = False,
) -> AppendJob | None:
    """Check that ``source`` may be appended to the dataset of ``target``; None if there is none.

    An absent or empty output folder is no dataset: the caller packs into it as
    usual. A sample with a file the dataset lists as skipped is left out (its
    entries in ``AppendJob.left_skipped``) unless ``retry_skipped``: a file a
    pack refused is not let in by an append. Nothing is written here.

    Raises:
        StorageError: ``target`` is a URL.
        OutputExistsError: the folder holds files but no manifest (an unfinished pack).
        PackError: keys already in the dataset (without ``skip_existing``), another
            backend or codec, or classes that would renumber the old ones.
    """
    out = dataset_folder(target)
    if not (out / MANIFEST_NAME).exists():
        if out.is_dir() and dataset_entries(out):
            raise OutputExistsError(
                f"{out}: nothing to append to: the folder holds files but no {MANIFEST_NAME} "
                "(an unfinished pack?). Finish it with --resume first, or choose another folder",
                path=out)
        return None
    manifest_bytes = (out / MANIFEST_NAME).read_bytes()
    base = load_manifest(out)
    options = _write_options(out, base, options)
    classes, relabel = _joint_classes(out, base, source)
    samples, existing = _new_samples(out, base, source, skip_existing=skip_existing)
    left: list[Bad] = []
    if base.skipped and not retry_skipped:
        listed = {s.path: s.reason for s in base.skipped}
        fresh = []
        for sample in samples:
            rels = [display_path(rel) for rel in sample.rel_paths()]
            if any(rel in listed for rel in rels):
                left += [(rel, listed[rel]) for rel in rels if rel in listed]
            else:
                fresh.append(sample)
        samples = fresh
    if relabel is not None:
        samples = [s._replace(label=None if s.label is None else relabel[s.label])
                   for s in samples]
    # the staged pack resumes only for the same input on the same dataset with the same choice
    digest = hashlib.sha256(b"\0".join([source.digest.encode(), manifest_bytes,
                                        str(skip_existing).encode(),
                                        str(retry_skipped).encode()])).hexdigest()
    _remove_unnamed_shards(out, base)
    return AppendJob(out=out, base=base, options=options, target=AppendTarget(out),
                     existing_skipped=existing, left_skipped=tuple(left),
                     source=dataclasses.replace(source, samples=tuple(samples), classes=classes,
                                                digest=digest))


def appended_options(out: str | os.PathLike[str],
                     given: Mapping[str, Any]) -> WriteOptions | None:
    """The write options of an append to the dataset in ``out``: its own, ``given`` replacing.

    What ``shardio pack --append`` passes for the options named on its command
    line. None where ``out`` holds no local dataset (``pack`` then packs anew,
    or says why it cannot append).
    """
    if is_url(out) or not (Path(out) / MANIFEST_NAME).is_file():
        return None
    return dataclasses.replace(_dataset_options(load_manifest(out)), **given)


def _dataset_options(base: Manifest) -> WriteOptions:
    """The options the dataset was written with (its manifest's), for the new shards."""
    stored = base.options
    samples = stored.get("max_shard_samples")
    return WriteOptions(backend=base.backend, codec=base.codec, level=int(stored.get("level", 3)),
                        max_shard_bytes=int(stored.get("max_shard_bytes",
                                                       DEFAULT_MAX_SHARD_BYTES)),
                        max_shard_samples=None if samples is None else int(samples),
                        version=max(base.version, LAST_FRAMED_VERSION),
                        block_records=base.block_records)


def _write_options(out: Path, base: Manifest, options: WriteOptions | None) -> WriteOptions:
    """``options``, or the dataset's own; another backend or codec is refused."""
    if options is None:
        return _dataset_options(base)
    if (options.backend, options.codec) != (base.backend, base.codec):
        raise PackError(
            f"{out}: the dataset is backend {base.backend!r} with codec {base.codec!r}, but "
            f"the append asks for backend {options.backend!r} with codec {options.codec!r}; "
            "one dataset has one backend and codec. Leave --backend/--codec out (the dataset's "
            f"are used), or pass --backend {base.backend} --codec {base.codec}", path=out)
    return options


def _joint_classes(out: Path, base: Manifest, source: PackSource
                   ) -> tuple[tuple[str, ...] | None, list[int] | None]:
    """The classes after the append, and each SRC class index's index among them."""
    layout = (IMAGEFOLDER if source.is_imagefolder else CLASS_FOLDERS if source.class_folders
              else GENERIC)
    if base.layout != layout:
        what, flag = {
            IMAGEFOLDER: ("an ImageFolder pack (fields image, label)", "--imagefolder"),
            CLASS_FOLDERS: ("a pack of class folders (one field per file, and a label)",
                            "--class-folders"),
            GENERIC: ("a generic pack (one field per file)", "--no-imagefolder"),
        }[base.layout]
        raise PackError(
            f"{out}: the dataset is {what}, but {source.root} was read the other way; "
            f"append SRC read as the dataset was (pass {flag}, or leave the flag out)", path=out)
    if base.classes is None or source.classes is None:
        return None, None
    old = base.classes
    added = sorted(set(source.classes) - set(old))
    early = [c for c in added if c < old[-1]]
    if early:
        moved = [c for c in old if c > early[0]]
        raise PackError(
            f"{source.root}: new class(es) {_listed(early)} sort before the existing class "
            f"{old[-1]!r}. Classes are numbered in sorted order (as torchvision's ImageFolder "
            f"does), so adding them would change the label of {_listed(moved)} for samples "
            "already stored and for models trained on them. Only classes sorting after "
            f"{old[-1]!r} can be appended: rename the new class folders, or pack everything "
            "into a new dataset", path=source.root)
    joint = (*old, *added)
    return joint, [joint.index(c) for c in source.classes]


def _new_samples(out: Path, base: Manifest, source: PackSource, *,
                 skip_existing: bool) -> tuple[list[SourceSample], int]:
    """SRC's samples whose keys the dataset does not hold yet (from its key blocks only)."""
    with DatasetReader(out) as reader:
        known = set(reader.keys())
    samples = [s for s in source.samples if s.key not in known]
    repeated = [s.key for s in source.samples if s.key in known]
    if repeated and not skip_existing:
        raise PackError(
            f"{out}: {len(repeated)} sample key(s) of {source.root} are already in the dataset "
            f"({_listed(repeated)}); a key names one sample, so they cannot be appended again. "
            "Pass --skip-existing (skip_existing=True) to append only the new ones, or rename "
            "them", path=out)
    return samples, len(repeated)


def _remove_unnamed_shards(out: Path, base: Manifest) -> None:
    """Delete shard files an interrupted append renamed in but no manifest names.

    Only names numbered after the dataset's last shard: never a file the manifest holds.
    """
    first = next_shard_number(base)
    named = {s.name for s in base.shards}
    for name in os.listdir(out):
        match = _NUMBERED.match(name)
        if match and int(match[1]) >= first and name not in named:
            (out / name).unlink()


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(repr(k) for k in items[:MAX_LISTED])
    return shown + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")
