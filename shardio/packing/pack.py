"""``shardio.pack``: a folder or ImageFolder into shuffled shards, in parallel and resumably.

The pipeline is scan (``shardio.packing.sources.files``, its walk split into tasks by
``shardio.packing.scan``) → seeded permutation of the sorted samples → shard boundaries
planned from the scanned sizes (``shardio.packing.plan``) → whole shards built by
an engine's tasks (``shardio.packing.build``; ``shardio.packing.engines``: forked
processes on this machine, or a Dask cluster) → the manifest. Each shard's
bytes depend only on the input and the options, so shards and manifest are
byte-identical whatever the engine and the number of workers. This
process only journals each finished shard (``shardio.packing.journal``), in whatever
order they finish, under an identity covering the input listing and every
option that shapes the output; ``resume=True`` reuses every journaled shard
that is still intact and builds the rest, so an interrupted pack (even one
killed with SIGKILL) ends exactly as an uninterrupted one would have. The
output is a folder or a URL (``shardio.packing.target``: shards staged locally,
uploaded one by one, the manifest last). Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from shardio.errors import (
    BadInputError,
    EmptySourceError,
    PackError,
    StorageError,
)
from shardio.format.blockfile import block_records_for
from shardio.format.manifest import CLASS_FOLDERS_OPTION, JOURNAL_NAME, MANIFEST_NAME
from shardio.packing.append import pack_choices, prepare_append, settle_interrupted_append
from shardio.packing.build import (
    CHANGED,
    ShardFailure,
    ShardJob,
    file_image_problem,
    is_image_field,
)
from shardio.packing.engines import PackEngine, open_engine
from shardio.packing.journal import dataset_lock
from shardio.packing.plan import PLAN_VERSION, framed_bounds, plan_shards
from shardio.packing.pool import ProgressBar, default_workers
from shardio.packing.progress import pack_manifest, resumable_shards
from shardio.packing.sources.files import (
    IMAGEFOLDER_RULES,
    Bad,
    PackSource,
    dataset_source,
    display_path,
)
from shardio.packing.sources.inputbytes import is_locator, locator_name
from shardio.packing.sources.mds import mds_index, scan_mds
from shardio.packing.sources.objects import is_python_source, scan_objects
from shardio.packing.sources.tables import scan_tables, table_files
from shardio.packing.sources.tars import scan_tars, tar_shards
from shardio.packing.target import LocalTarget, PackTarget, open_target
from shardio.packing.writer import WriteOptions
from shardio.storage import RemoteOptions
from shardio.storage.location import is_url


@dataclass(frozen=True)
class PackSummary:
    """What a pack did; ``to_json()`` is what ``shardio pack --json`` prints.

    ``ratio`` is ``output_bytes / input_bytes``. ``seconds``, ``files_per_s`` and
    ``mb_per_s`` cover this run only (after a resume, the part it packed).
    """

    out: str
    samples: int
    files: int
    shards: int
    input_bytes: int
    output_bytes: int
    ratio: float
    seconds: float
    files_per_s: float
    mb_per_s: float
    hidden_ignored: int
    skipped: tuple[Bad, ...]
    imagefolder: bool
    resumed_samples: int = 0
    existing_samples: int = 0
    """With ``append``: samples the dataset held before (``samples`` counts the new ones)."""
    existing_skipped: int = 0
    """With ``skip_existing``: samples of SRC left out because their keys were in the dataset."""
    class_folders: bool = False
    """Generic samples labelled by their top-level folder (``pack(class_folders=True)``)."""
    notes: tuple[str, ...] = ()
    """How samples were made where it is not plain (a Python object's images made PNG)."""

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict; ``skipped`` as ``[{"path", "reason"}, …]``."""
        data = asdict(self)
        data["skipped"] = [{"path": p, "reason": r} for p, r in self.skipped]
        return data


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: a pack builds millions of acyclic tuples that it would rescan."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _refuse_bad(source: PackSource, check_images: bool) -> None:
    """Refuse the bad inputs the walk found, with every image a build would refuse."""
    if source.bad:
        raise _bad_inputs(source, check_images)


def _bad_inputs(source: PackSource, check_images: bool, failed: Bad | None = None) -> BadInputError:
    """Every bad input of ``source`` at once: the walk's, and the images a build would refuse,
    read now (``failed``: the file a build stopped at), so that a source fixed once packs.

    Reading every image costs what a pack's read does, and only when the pack fails anyway.
    """
    found = {*source.bad, *([] if failed is None else [failed]),
             *_image_problems(source, check_images)}
    bad = sorted(found)
    first = bad[0][0]
    listing = "".join(f"\n  {p}: {r}" for p, r in bad[:10])
    more = f"\n  … and {len(bad) - 10} more" if len(bad) > 10 else ""
    generic = ""
    if source.is_imagefolder and any(r in IMAGEFOLDER_RULES for _, r in bad):
        # these files are bad only as ImageFolder input: --skip-bad alone would drop
        # them, which is wrong when they are the other fields of their samples
        generic = ("; or, if SRC is not an ImageFolder (say a/x.jpg comes with a/x.json), "
                   "pass --no-imagefolder (imagefolder=False) to keep every file, grouped "
                   "into generic samples by name stem, without labels")
    if failed is not None and failed[1].startswith(CHANGED):  # a resume would see another SRC
        fix = ("Something changed SRC while it was packed: let it finish, then pack again with "
               "--overwrite (overwrite=True), adding --skip-bad (skip_bad=True) for the rest")
    elif failed is not None:
        fix = ("Fix or remove them and pack again with --overwrite, or add --skip-bad --resume "
               "(skip_bad=True, resume=True) to keep the shards finished and pack without them")
    else:
        fix = "Fix or remove them, or pass --skip-bad (skip_bad=True) to pack without them"
    return BadInputError(
        f"{os.path.join(source.root, first)}: {bad[0][1]}. {len(bad)} input(s) "
        f"in {source.root} cannot be packed:{listing}{more}\n{fix} (they are then listed in "
        f"the summary and the manifest){generic}",
        path=os.path.join(source.root, first),
    )


def _image_problems(source: PackSource, decode: bool) -> list[Bad]:
    """The image files of ``source``'s samples that a shard build would refuse, read in
    threads (reads release the GIL); named relative to SRC, as the walk names its files."""
    paths = [path for sample in source.samples
             for name, path in zip(sample.fields, sample.paths, strict=True)
             if is_image_field(name)]
    with ThreadPoolExecutor(min(32, len(paths) or 1), "shardio-check") as pool:
        reasons = list(pool.map(functools.partial(file_image_problem, decode=decode), paths))
    return [(_relative(source, path), reason) for path, reason in zip(paths, reasons, strict=True)
            if reason is not None]


def _relative(source: PackSource, path: str) -> str:
    """``path`` (a sample's file) relative to SRC, as the walk names bad files."""
    if is_locator(path):  # a member of a container: named as the source scan named it
        return locator_name(path)
    return display_path(os.path.relpath(path, source.root).replace(os.sep, "/"))


def pack(
    src: str | os.PathLike[str] | object,
    out: str | os.PathLike[str],
    *,
    options: WriteOptions | None = None,
    imagefolder: bool | None = None,
    class_folders: bool = False,
    seed: int = 0,
    shuffle: bool = True,
    num_workers: int | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    follow_symlinks: bool = False,
    check_images: bool | None = None,
    skip_bad: bool | None = None,
    overwrite: bool = False,
    resume: bool = False,
    append: bool = False,
    skip_existing: bool = False,
    retry_skipped: bool = False,
    progress: bool | None = None,
    remote: RemoteOptions | None = None,
    engine: str = "local",
    scheduler: str | None = None,
    force: bool = False,
    source_format: str | None = None,
    label_field: str | None = None,
    key_column: str | None = None,
) -> PackSummary:
    """Pack the folder ``src`` into a shardio dataset at ``out``, a folder or a URL.

    Samples follow the naming rules of ``shardio.packing.sources.files.scan_source`` (generic
    folders) or ``imagefolder_order`` (ImageFolders, fields ``image`` and
    ``label``). Their order in the shards is a seeded permutation of the sorted
    sample list, the same for any ``num_workers``. Shards are cut before any
    file is read, from the scanned sizes (``shardio.packing.plan``): each holds at
    most ``options.max_shard_bytes`` of framed records, and an input smaller
    than 64 such shards is cut into about 64 shards of at least 16 MB, so that
    every worker has whole shards to build.

    An ``out`` URL (``s3://bucket/prefix``, ``gs://…``, any fsspec protocol
    that can list) gets the same bytes as a local folder would: each shard is
    built in a local staging folder, uploaded and deleted, the journal object
    replaced after each upload, ``manifest.json`` uploaded last
    (``shardio.packing.target``). Staging needs about ``num_workers`` shards of space.

    Args:
        src: the folder to pack; a local path (a URL is refused). Or a Python object
            (``packing.sources.objects``): a ``datasets.Dataset``, a torchvision-style dataset
            naming its files (``.samples``), a map-style dataset of dicts or
            ``(image, label)`` pairs (read in ``num_workers`` forked processes), or an
            iterable of sample dicts.
        out: the dataset folder or URL; must be empty or absent unless
            ``overwrite``/``resume``.
        options: backend, codec, level and shard size limits.
        imagefolder: force ImageFolder (``True``) or generic (``False``); ``None`` detects it.
        class_folders: generic samples (one field per file) with a ``label`` too: the
            index of the sample's top-level folder among SRC's sorted top-level
            folders, which become ``classes``, as torchvision's ``DatasetFolder`` does
            for any file type (audio, arrays, text). Not with ``imagefolder=True``.
        seed: seed of the permutation.
        shuffle: ``False`` keeps the sorted order.
        num_workers: processes that build shards; ``None`` uses every core, 1 works here.
        include: keep only files whose relative path matches one of these globs.
        exclude: leave out files whose relative path matches one of these globs.
        follow_symlinks: pack what symbolic links point to (otherwise they are bad input).
        check_images: decode every image with Pillow; those that fail are bad input.
            Without it, each JPEG, PNG and WebP is still checked complete (header and
            end marker, no decode: ``shardio.packing.build.image_problem``).
            ``None``: as the dataset was packed with ``append``, else off.
        skip_bad: leave bad inputs out (listed in the summary and manifest) instead of
            failing. ``None``: as the dataset was packed with ``append``, else off.
        overwrite: replace the dataset in ``out``.
        resume: finish an interrupted pack of the same input with the same options.
        append: add SRC's samples to the dataset in ``out`` as new shards after its own
            (``shardio.packing.append``); ``options`` default to the dataset's, whose backend and
            codec they must keep. An interrupted append of the same input continues.
        skip_existing: with ``append``, leave out samples whose keys the dataset holds
            (counted in the summary) instead of refusing them.
        retry_skipped: with ``append``, pack files the dataset lists as skipped if they
            pass now (they are otherwise left out again, and listed in the summary).
        progress: show a progress bar; ``None`` shows one when stderr is a terminal.
        remote: how a URL ``out`` is reached (``RemoteOptions``); only its
            ``storage_options`` and ``retry`` matter when writing. Ignored for a
            local ``out``.
        engine: ``"local"`` (this machine) or ``"dask"``: SRC walked and shards built
            as tasks on a Dask cluster (``shardio.packing.engines``; ``pip install
            'shardio-torch[dask]'``), the same bytes. ``src`` and a local ``out`` must be
            on a filesystem every worker sees at the same path.
        scheduler: with ``"dask"``, the scheduler's address (``tcp://host:8786``);
            ``None`` starts a local cluster of ``num_workers`` processes.
        force: pack ``src`` even when it is a shardio dataset (its shard files become samples).
        source_format: what ``src`` is: ``"folder"`` (files), ``"webdataset"`` (tar shards:
            a folder of them, a glob or ``train-{000000..000099}.tar``;
            ``packing.sources.tars``), ``"table"`` (Parquet files, a file or a folder of them, or
            a ``datasets.save_to_disk`` folder; ``packing.sources.tables``), ``"mds"`` (a MosaicML
            Streaming folder: ``index.json`` and its shards; ``packing.sources.mds``); ``None``
            recognises tables, MDS folders and tar shards, else a folder.
        label_field: with WebDataset tars, the field (``cls``) whose text becomes ``label``;
            with MDS, the integer column.
        key_column: with a table, a ``datasets.Dataset`` or MDS, the column whose values are
            the keys (default: the row's position).

    Raises:
        BadInputError: an input cannot be packed (and not ``skip_bad``); names the file.
        EmptySourceError: nothing to pack.
        OutputExistsError: ``out`` holds other files and neither ``overwrite`` nor ``resume``.
        MissingDependencyError: ``engine="dask"`` without dask installed.
        PackError: with ``append``, keys already in the dataset, another backend or codec,
            or new classes sorting before old ones.
        StorageError: ``src`` is a URL, or ``out``'s store failed after retries.
        PackError: another pack on this host is writing to the same ``out`` URL, or ``src``
            is a shardio dataset (and not ``force``).
    """
    start = time.perf_counter()
    path = None if is_python_source(src) else cast("str | os.PathLike[str]", src)
    root = Path(type(src).__name__) if path is None else _local_source(path)
    if source_format not in (None, "folder", "webdataset", "table", "mds"):
        raise ValueError(f"unknown source_format {source_format!r}; expected 'folder', "
                         "'webdataset', 'table' or 'mds'")
    tables = table_files(path) if path is not None and source_format in (None, "table") \
        else None
    if source_format == "table" and tables is None:
        raise BadInputError(f"{root}: not a table: pass a .parquet file, a folder of them or "
                            "a datasets.save_to_disk folder", path=str(root))
    mds = mds_index(path) if path is not None and tables is None and source_format in (
        None, "mds") else None
    if source_format == "mds" and mds is None:
        raise BadInputError(f"{root}: not an MDS dataset: pass the folder holding its "
                            "index.json (MosaicML Streaming, format version 2)", path=str(root))
    shards = None if path is None or source_format == "folder" or tables is not None \
        or mds is not None else tar_shards(path)
    if source_format == "webdataset" and shards is None:
        raise BadInputError(f"{root}: not WebDataset tar shards: pass a .tar file, a folder "
                            "holding only .tar/.tar.gz files, a glob or a brace pattern",
                            path=str(root))
    if label_field is not None and shards is None and mds is None:
        raise ValueError("label_field names a field of WebDataset tars or an MDS column; a "
                         "folder is labelled with imagefolder or class_folders")
    if not force and path is not None and shards is None and tables is None and mds is None:
        _refuse_dataset(root)
    with contextlib.closing(open_target(out, remote)) as target, _write_lock(
            target, append=append, overwrite=overwrite, resume=resume), contextlib.closing(
            open_engine(engine, num_workers=num_workers, scheduler=scheduler)) as runner, \
            _gc_paused(), (contextlib.nullcontext("") if tables is None and mds is None
                           and path is not None else
                           tempfile.TemporaryDirectory(prefix="shardio-cells-")) as spill_dir:
        if isinstance(target, LocalTarget) and path is not None:
            _refuse_nested(root, target.staging)
        imagefolder, class_folders, check_images, skip_bad = pack_choices(
            target, append=append, imagefolder=imagefolder, class_folders=class_folders,
            check_images=check_images, skip_bad=skip_bad)
        workers = num_workers or default_workers()
        if path is None:
            source = scan_objects(src, spill_dir=spill_dir, num_workers=workers,
                                  key_column=key_column)
        elif tables:
            source = scan_tables(tables, spill_dir=spill_dir, key_column=key_column,
                                 num_workers=workers)
        elif mds is not None:
            source = scan_mds(path, mds, spill_dir=spill_dir, num_workers=workers,
                              key_column=key_column, label_field=label_field)
        elif shards is not None:
            source = scan_tars(shards, label_field=label_field, shuffle=shuffle,
                               num_workers=workers)
        else:
            source = runner.scan(path, imagefolder=imagefolder, include=include,
                                 exclude=exclude, follow_symlinks=follow_symlinks,
                                 class_folders=class_folders)
        pack_options: dict[str, Any] = {
            "imagefolder": source.is_imagefolder, "include": list(include),
            "exclude": list(exclude), "follow_symlinks": follow_symlinks,
            "check_images": check_images}
        if source.class_folders:  # only then: a resume of an older pack keeps its identity
            pack_options[CLASS_FOLDERS_OPTION] = True
        if source.origin != "folder":
            pack_options.update({"from": source.origin, "label_field": label_field,
                                 "key_column": key_column})
        return _pack_or_append(source, target, options, pack_options, append=append,
                               skip_existing=skip_existing, seed=seed, shuffle=shuffle,
                               engine=runner, skip_bad=skip_bad, overwrite=overwrite,
                               retry_skipped=retry_skipped,
                               resume=resume, progress=progress, start=start)


def pack_imagefolder(
    dataset_or_root: Any,
    out: str | os.PathLike[str],
    *,
    options: WriteOptions | None = None,
    seed: int = 0,
    shuffle: bool = True,
    num_workers: int | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    follow_symlinks: bool = False,
    check_images: bool | None = None,
    skip_bad: bool | None = None,
    overwrite: bool = False,
    resume: bool = False,
    append: bool = False,
    skip_existing: bool = False,
    retry_skipped: bool = False,
    progress: bool | None = None,
    remote: RemoteOptions | None = None,
) -> PackSummary:
    """Pack an ImageFolder: a root folder, or a torchvision ``ImageFolder``/``DatasetFolder``.

    A dataset object is anything with ``.samples``, ``.classes`` and
    ``.class_to_idx`` (see ``shardio.packing.sources.files.dataset_source``); its classes and
    labels are packed as they are and torchvision is never imported. A path is
    packed like ``pack(root, out, imagefolder=True)``. The other arguments are
    those of ``pack`` (``follow_symlinks`` applies to a path only).
    """
    common: dict[str, Any] = {
        "options": options, "seed": seed, "shuffle": shuffle, "num_workers": num_workers,
        "include": include, "exclude": exclude, "check_images": check_images,
        "skip_bad": skip_bad, "overwrite": overwrite, "resume": resume, "append": append,
        "skip_existing": skip_existing, "retry_skipped": retry_skipped, "progress": progress,
        "remote": remote}
    if isinstance(dataset_or_root, (str, os.PathLike)):
        return pack(dataset_or_root, out, imagefolder=True, follow_symlinks=follow_symlinks,
                    **common)
    start = time.perf_counter()
    with contextlib.closing(open_target(out, remote)) as target, _write_lock(
            target, append=append, overwrite=overwrite, resume=resume), _gc_paused():
        source = dataset_source(dataset_or_root, include=include, exclude=exclude)
        _, _, check_images, skip_bad = pack_choices(
            target, append=append, imagefolder=True, class_folders=False,
            check_images=check_images, skip_bad=skip_bad)
        pack_options = {"imagefolder": True, "include": list(include), "exclude": list(exclude),
                        "follow_symlinks": True, "check_images": check_images}
        return _pack_or_append(source, target, options, pack_options, append=append,
                               skip_existing=skip_existing, seed=seed, shuffle=shuffle,
                               engine=open_engine("local", num_workers=num_workers),
                               skip_bad=skip_bad, overwrite=overwrite, resume=resume,
                               retry_skipped=retry_skipped,
                               progress=progress, start=start)


def _write_lock(target: PackTarget, *, append: bool, overwrite: bool,
                resume: bool) -> contextlib.AbstractContextManager[object]:
    """A local output's write lock (``shardio.packing.journal.dataset_lock``): one writer at a time.

    A URL's staging folder is locked instead (``shardio.packing.remote_target``).
    """
    if not isinstance(target, LocalTarget):
        return contextlib.nullcontext()
    mode = "--append" if append else "--overwrite" if overwrite else "--resume" if resume else ""
    return dataset_lock(target.staging, f"shardio pack {mode}".rstrip())


def _local_source(src: str | os.PathLike[str]) -> Path:
    """``src`` as a local folder; a URL is refused: pack reads local files (OUT may be a URL)."""
    if is_url(src):
        text = os.fspath(src)
        raise StorageError(
            f"{text}: the source is a URL; shardio pack reads SRC from a local folder (the "
            "output OUT may be a URL such as s3://bucket/prefix). Copy the files to a local "
            "folder first (for example with `aws s3 sync` or `gsutil rsync`) and pass its path",
            path=text)
    return Path(src)


def _refuse_dataset(src: Path) -> None:
    """Refuse a SRC that is a shardio dataset (or a pack's unfinished output): its shard files
    would be packed as samples, which is never what reading or adding to it needs."""
    marks = [name for name in (MANIFEST_NAME, JOURNAL_NAME) if (src / name).is_file()]
    if marks:
        what = "a shardio dataset" if marks[0] == MANIFEST_NAME else "an unfinished shardio pack"
        raise PackError(
            f"{src}: the source is {what} (it holds {marks[0]}), not a folder of files: packing "
            "it would store its shard files as samples. Read it as it is (StreamingDataset, "
            "`shardio ls`), combine datasets with `shardio merge`, or restore its files with "
            "`shardio unpack` and pack those; pass --force (force=True) to pack its files "
            "anyway", path=src)


def _refuse_nested(src: Path, out: Path) -> None:
    src_abs, out_abs = src.resolve(), out.resolve()
    if out_abs == src_abs or (src_abs in out_abs.parents and not any(
            part.startswith(".") for part in out_abs.relative_to(src_abs).parts)):
        raise PackError(f"{out}: the output folder is inside the source {src}, so the pack "
                        "would read its own output; choose an output folder outside it",
                        path=out)


def _pack_or_append(
    source: PackSource, target: PackTarget, options: WriteOptions | None,
    pack_options: dict[str, Any], *, append: bool, skip_existing: bool, overwrite: bool,
    resume: bool, skip_bad: bool, start: float, retry_skipped: bool = False, **run: Any,
) -> PackSummary:
    """``_pack_source``; with ``append``, into an append's staging folder, then published."""
    if ((skip_existing or retry_skipped) and not append) or (append and overwrite):
        raise ValueError("skip_existing and retry_skipped go with append, and append never "
                         f"overwrites: got append={append}, skip_existing={skip_existing}, "
                         f"retry_skipped={retry_skipped}, overwrite={overwrite}")
    if not append:
        settle_interrupted_append(target, overwrite=overwrite, resume=resume)
    job = prepare_append(target, source, options, skip_existing=skip_existing,
                         retry_skipped=retry_skipped) if append else None
    if job is None:
        return _pack_source(source, target, options or WriteOptions(), pack_options,
                            overwrite=overwrite, resume=resume, skip_bad=skip_bad, start=start,
                            **run)
    if not job.source.samples and (job.existing_skipped or job.left_skipped):  # nothing new
        if not skip_bad:
            _refuse_bad(source, bool(pack_options["check_images"]))
        return PackSummary(
            out=str(job.out), samples=0, files=0, shards=0, input_bytes=0, output_bytes=0,
            ratio=0.0, seconds=time.perf_counter() - start, files_per_s=0.0, mb_per_s=0.0,
            hidden_ignored=source.hidden_ignored, skipped=(*source.bad, *job.left_skipped),
            imagefolder=source.is_imagefolder, class_folders=source.class_folders,
            existing_samples=job.base.num_samples,
            existing_skipped=job.existing_skipped)
    summary = _pack_source(job.source, job.target, job.options, pack_options, overwrite=False,
                           resume=True, skip_bad=skip_bad, start=start, **run)
    return job.publish(summary)


def _pack_source(
    source: PackSource, target: PackTarget, options: WriteOptions,
    pack_options: dict[str, Any], *, seed: int, shuffle: bool, engine: PackEngine,
    skip_bad: bool, overwrite: bool, resume: bool, progress: bool | None, start: float,
) -> PackSummary:
    if not skip_bad:
        _refuse_bad(source, bool(pack_options["check_images"]))
    if not source.samples:
        raise EmptySourceError(
            f"{source.root}: nothing to pack ({source.hidden_ignored} hidden entries ignored, "
            f"{source.excluded} files excluded by --include/--exclude, {len(source.bad)} bad "
            "inputs); point SRC at a folder that holds files", path=source.root)
    order = list(range(len(source.samples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    samples = source.samples
    stream = [samples[i] for i in order]
    bounds = framed_bounds(stream)
    plan = plan_shards(bounds, max_shard_bytes=options.max_shard_bytes,
                       max_shard_samples=options.max_shard_samples)
    if options.version >= 3 and options.block_records is None:  # from the samples' sizes
        options = replace(options, block_records=block_records_for(
            sum(bounds) / max(len(bounds), 1)))
    identity = {"write": asdict(options), "plan": PLAN_VERSION, "source": source.digest,
                "seed": seed, "shuffle": shuffle, "pack": pack_options}
    job = ShardJob(stream, plan, target.staging, options.backend, options.codec, options.level,
                   bool(pack_options["check_images"]), skip_bad, source.is_imagefolder,
                   version=options.version, block_records=options.block_records)
    target.prepare(overwrite=overwrite, resume=resume)
    done = resumable_shards(job, identity, target) if resume else {}
    resumed = dict(done)
    # in the order shards finish: each one more line of the journal
    journaled = [asdict(done[n]) for n in sorted(done)]
    journal = {"identity": identity, "shards": journaled}
    target.write_journal(journal)
    todo = [n for n in range(len(plan)) if n not in done]
    files_upto = list(itertools.accumulate((len(s.paths) for s in stream), initial=0))
    bytes_upto = list(itertools.accumulate((s.num_bytes for s in stream), initial=0))
    bar = ProgressBar(sys.stderr.isatty() if progress is None else progress, files_upto[-1],
                    sum(files_upto[plan[n].stop] - files_upto[plan[n].start] for n in done))
    try:
        results = engine.build(job, todo, target, bar.show if bar.bar is not None else None)
        with contextlib.closing(results):
            for result in results:
                if isinstance(result, ShardFailure):
                    raise _bad_inputs(source, job.check_images,
                                      (_relative(source, result.path), result.reason))
                done[result.number] = result  # the engine put it in the output
                journaled.append(asdict(result))
                target.write_journal(journal)
    except KeyboardInterrupt as exc:  # the engine stopped its workers; say what is kept
        # still a KeyboardInterrupt, so that Python exits as Ctrl-C does (signal status): a
        # note (``add_note`` from 3.11 on; the CLI reads the first) says what the pack kept
        kept = sum(r.num_samples for r in done.values())
        exc.__notes__ = [*getattr(exc, "__notes__", []),
                         f"{len(done):,} of {len(plan):,} shards ({kept:,} of {len(stream):,} "
                         f"samples) are finished and kept in {target.url}",
                         "finish the pack with resume=True (--resume) and the same source and "
                         "options"]
        raise
    finally:
        bar.close()
    left_out = [stream[i] for r in done.values() for i in r.left_out]
    input_bytes = bytes_upto[-1] - sum(s.num_bytes for s in left_out)
    manifest = pack_manifest(job, source, options, done, input_bytes=input_bytes, seed=seed,
                             shuffle=shuffle, pack_options={**pack_options, "skip_bad": skip_bad})
    target.write_manifest(manifest)
    target.finish()
    seconds = time.perf_counter() - start
    this_run = [plan[n] for n in todo]
    return PackSummary(
        out=target.url, samples=manifest.num_samples,
        files=files_upto[-1] - sum(len(s.paths) for s in left_out),
        shards=len(manifest.shards), input_bytes=input_bytes, output_bytes=manifest.num_bytes,
        ratio=manifest.num_bytes / max(input_bytes, 1), seconds=seconds,
        files_per_s=sum(files_upto[r.stop] - files_upto[r.start] for r in this_run) / seconds,
        mb_per_s=sum(bytes_upto[r.stop] - bytes_upto[r.start] for r in this_run) / 1e6 / seconds,
        hidden_ignored=source.hidden_ignored,
        skipped=tuple((f.path, f.reason) for f in manifest.skipped),
        imagefolder=source.is_imagefolder,
        resumed_samples=sum(r.num_samples for r in resumed.values()),
        class_folders=source.class_folders, notes=source.notes,
    )
