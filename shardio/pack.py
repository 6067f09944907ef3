"""``shardio.pack``: a folder or ImageFolder into shuffled shards, in parallel and resumably.

The pipeline is scan (``shardio.source``) → seeded permutation of the sorted
samples → read and encode (in this process, or in ``num_workers`` forked
processes that return framed records) → ``ShardWriter``, in stream order. Only
this process writes, so shards and manifest are byte-identical whatever the
number of workers. The writer's journal plus an identity covering the input
listing and every option that shapes the output let ``resume=True`` finish an
interrupted pack (even one killed with SIGKILL) exactly as an uninterrupted one
would have. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import random
import signal
import struct
import sys
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardio.backends import open_shard, shard_name
from shardio.codecs import Codec, get_codec
from shardio.errors import BadInputError, EmptySourceError, PackError, RecordEncodeError
from shardio.record import KEY_FIELD, encode_record
from shardio.source import (
    IMG_EXTENSIONS,
    Bad,
    Source,
    SourceSample,
    dataset_source,
    scan_source,
)
from shardio.writer import ShardWriter, WriteOptions

CHUNK_SAMPLES = 256
CHUNK_BYTES = 8 << 20
"""A worker task is at most this many samples or bytes: large enough to amortise IPC."""

_Encoded = tuple["bytes | None", int, "str | None"]
"""``(framed record, or None with the failing field's position and the reason)``."""


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

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict; ``skipped`` as ``[{"path", "reason"}, …]``."""
        data = asdict(self)
        data["skipped"] = [{"path": p, "reason": r} for p, r in self.skipped]
        return data


@dataclass(frozen=True)
class _Job:
    """What a worker needs to turn stream positions into framed records."""

    stream: Sequence[SourceSample]
    codec: str
    level: int
    check_images: bool


_job: _Job | None = None
_codec: Codec | None = None


def _init_worker(job: _Job) -> None:
    import ctypes  # only pool workers need it

    global _job, _codec
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    with contextlib.suppress(OSError, AttributeError):
        # PR_SET_PDEATHSIG: a worker dies with a parent killed by SIGKILL instead of lingering
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    _job = job
    _codec = get_codec(job.codec, job.level)


def _encode_range(bounds: tuple[int, int]) -> list[_Encoded]:
    assert _job is not None and _codec is not None, "worker not initialised"
    stream, codec, check = _job.stream, _codec, _job.check_images
    return [_encode(stream[i], codec, check) for i in range(*bounds)]


def _read_rest(fd: int) -> bytes:
    """What follows a first ``read``: a file that grew, or one over the 2 GiB read limit."""
    parts = []
    while chunk := os.read(fd, 1 << 24):
        parts.append(chunk)
    return b"".join(parts)


def _decode_error(data: bytes) -> str | None:
    from PIL import Image  # only --check-images needs Pillow here

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except Exception as exc:  # Pillow raises a zoo of types for broken images
        return f"does not decode as an image ({type(exc).__name__}: {exc})"
    return None


def _encode(sample: SourceSample, codec: Codec, check_images: bool) -> _Encoded:
    values: dict[str, Any] = {KEY_FIELD: sample.key}
    paths, sizes = sample.paths, sample.sizes
    for i, name in enumerate(sample.fields):
        size = sizes[i]
        try:
            fd = os.open(paths[i], os.O_RDONLY)
            try:
                data = os.read(fd, size + 1)
                if len(data) != size:
                    data += _read_rest(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            return None, i, f"cannot be read ({exc.strerror or exc})"
        if len(data) != size:
            return None, i, f"changed while packing ({size} bytes when scanned, {len(data)} read)"
        if check_images and (sample.label is not None or f".{name}".lower().endswith(
                IMG_EXTENSIONS)):
            reason = _decode_error(data)
            if reason is not None:
                return None, i, reason
        values[name] = data
    if sample.label is not None:
        values["label"] = sample.label
    try:
        return encode_record(values, codec), -1, None
    except (RecordEncodeError, struct.error) as exc:
        return None, 0, f"cannot be stored as a record ({exc})"


def _chunks(stream: Sequence[SourceSample], begin: int) -> list[tuple[int, int]]:
    bounds = []
    lo, nbytes = begin, 0
    for i in range(begin, len(stream)):
        nbytes += stream[i].num_bytes
        if i + 1 - lo >= CHUNK_SAMPLES or nbytes >= CHUNK_BYTES:
            bounds.append((lo, i + 1))
            lo, nbytes = i + 1, 0
    if lo < len(stream):
        bounds.append((lo, len(stream)))
    return bounds


def _encoded(
    job: _Job, begin: int, num_workers: int
) -> Generator[tuple[int, _Encoded], None, None]:
    """``(stream position, encoded)`` from ``begin`` on, in order."""
    bounds = _chunks(job.stream, begin) if num_workers > 1 else []
    if len(bounds) < 2:
        codec, stream, check = get_codec(job.codec, job.level), job.stream, job.check_images
        for pos in range(begin, len(stream)):
            yield pos, _encode(stream[pos], codec, check)
        return
    import multiprocessing  # only a pool needs it; `import shardio` stays lighter

    window = threading.Semaphore(4 * num_workers)
    stopped = threading.Event()

    def feed() -> Iterator[tuple[int, int]]:
        for bound in bounds:
            window.acquire()
            if stopped.is_set():
                return
            yield bound

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(min(num_workers, len(bounds)), _init_worker, (job,)) as pool:
        try:
            for bound, results in zip(bounds, pool.imap(_encode_range, feed()), strict=True):
                window.release()
                yield from zip(range(*bound), results, strict=True)
        finally:
            stopped.set()
            window.release()


class _Progress:
    """One tqdm bar (files, MB/s, ETA) on stderr, or nothing."""

    def __init__(self, enabled: bool, total: int, initial: int) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="file", unit_scale=True,
                            desc="pack", file=sys.stderr)
        self.start = time.perf_counter()
        self.files = 0
        self.bytes = 0

    def advance(self, files: int, nbytes: int) -> None:
        if self.bar is None:
            return
        self.files += files
        self.bytes += nbytes
        if self.files >= 64 or self.bar.n + self.files >= self.bar.total:
            mb_s = self.bytes / 1e6 / max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix_str(f"{mb_s:.1f} MB/s", refresh=False)
            self.bar.update(self.files)
            self.files = 0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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


def _default_workers() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _refuse_bad(source: Source) -> None:
    if not source.bad:
        return
    first = source.bad[0][0]
    listing = "".join(f"\n  {p}: {r}" for p, r in source.bad[:10])
    more = f"\n  … and {len(source.bad) - 10} more" if len(source.bad) > 10 else ""
    raise BadInputError(
        f"{os.path.join(source.root, first)}: {source.bad[0][1]}. {len(source.bad)} input(s) "
        f"in {source.root} cannot be packed:{listing}{more}\nFix or remove them, or pass "
        "--skip-bad to pack without them (they are then listed in the summary and the manifest)",
        path=os.path.join(source.root, first),
    )


def _resume_point(
    writer: ShardWriter, job: _Job, source: Source
) -> tuple[int, list[SourceSample], list[Bad]]:
    """Where the stream continues after the resumed shards, and the samples they left out."""
    done = writer.num_resumed
    if not done:
        return 0, [], []
    keys: set[str] = set()
    last = ""
    backend = writer.options.backend
    number = 0
    while len(keys) < done:
        reader = open_shard(backend, writer.out / shard_name(backend, number))
        try:
            shard_keys = reader.keys()
            keys.update(shard_keys)
            last = shard_keys[-1] if shard_keys else last
        finally:
            reader.close()
        number += 1
    stream = job.stream
    begin = next((i + 1 for i, s in enumerate(stream) if s.key == last), 0)
    left_out = [s for s in stream[:begin] if s.key not in keys]
    if begin - len(left_out) != done:
        raise PackError(f"{writer.out}: the finished shards do not hold the first samples of "
                        f"{source.root} in pack order; use --overwrite to pack again",
                        path=writer.out)
    codec = get_codec(job.codec, job.level)
    bad: list[Bad] = []
    for sample in left_out:
        _, failed, reason = _encode(sample, codec, job.check_images)
        bad += sample.bad(max(failed, 0), reason or "left out by the interrupted pack")
    return begin, left_out, bad


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    options: WriteOptions | None = None,
    imagefolder: bool | None = None,
    seed: int = 0,
    shuffle: bool = True,
    num_workers: int | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    follow_symlinks: bool = False,
    check_images: bool = False,
    skip_bad: bool = False,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
) -> PackSummary:
    """Pack the folder ``src`` into a shardio dataset at ``out``.

    Samples follow the naming rules of ``shardio.source.scan_source`` (generic
    folders) or ``imagefolder_order`` (ImageFolders, fields ``image`` and
    ``label``). Their order in the shards is a seeded permutation of the sorted
    sample list, the same for any ``num_workers``.

    Args:
        src: the folder to pack.
        out: the dataset folder; must be empty or absent unless ``overwrite``/``resume``.
        options: backend, codec, level and shard size limits.
        imagefolder: force ImageFolder (``True``) or generic (``False``); ``None`` detects it.
        seed: seed of the permutation.
        shuffle: ``False`` keeps the sorted order.
        num_workers: processes that read and encode; ``None`` uses every core, 1 works here.
        include: keep only files whose relative path matches one of these globs.
        exclude: leave out files whose relative path matches one of these globs.
        follow_symlinks: pack what symbolic links point to (otherwise they are bad input).
        check_images: decode every image with Pillow; those that fail are bad input.
        skip_bad: leave bad inputs out (listed in the summary and manifest) instead of failing.
        overwrite: replace the dataset in ``out``.
        resume: finish an interrupted pack of the same input with the same options.
        progress: show a progress bar; ``None`` shows one when stderr is a terminal.

    Raises:
        BadInputError: an input cannot be packed (and not ``skip_bad``); names the file.
        EmptySourceError: nothing to pack.
        OutputExistsError: ``out`` holds other files and neither ``overwrite`` nor ``resume``.
    """
    start = time.perf_counter()
    _refuse_nested(Path(src), Path(out))
    with _gc_paused():
        source = scan_source(src, imagefolder=imagefolder, include=include, exclude=exclude,
                             follow_symlinks=follow_symlinks)
        pack_options = {"imagefolder": source.classes is not None, "include": list(include),
                        "exclude": list(exclude), "follow_symlinks": follow_symlinks,
                        "check_images": check_images}
        return _pack_source(source, out, options or WriteOptions(), pack_options, seed=seed,
                            shuffle=shuffle, num_workers=num_workers, skip_bad=skip_bad,
                            overwrite=overwrite, resume=resume, progress=progress, start=start)


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
    check_images: bool = False,
    skip_bad: bool = False,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
) -> PackSummary:
    """Pack an ImageFolder: a root folder, or a torchvision ``ImageFolder``/``DatasetFolder``.

    A dataset object is anything with ``.samples``, ``.classes`` and
    ``.class_to_idx`` (see ``shardio.source.dataset_source``); its classes and
    labels are packed as they are and torchvision is never imported. A path is
    packed like ``pack(root, out, imagefolder=True)``. The other arguments are
    those of ``pack`` (``follow_symlinks`` applies to a path only).
    """
    common: dict[str, Any] = {
        "options": options, "seed": seed, "shuffle": shuffle, "num_workers": num_workers,
        "include": include, "exclude": exclude, "check_images": check_images,
        "skip_bad": skip_bad, "overwrite": overwrite, "resume": resume, "progress": progress}
    if isinstance(dataset_or_root, (str, os.PathLike)):
        return pack(dataset_or_root, out, imagefolder=True, follow_symlinks=follow_symlinks,
                    **common)
    start = time.perf_counter()
    with _gc_paused():
        source = dataset_source(dataset_or_root, include=include, exclude=exclude)
        pack_options = {"imagefolder": True, "include": list(include), "exclude": list(exclude),
                        "follow_symlinks": True, "check_images": check_images}
        return _pack_source(source, out, options or WriteOptions(), pack_options, seed=seed,
                            shuffle=shuffle, num_workers=num_workers, skip_bad=skip_bad,
                            overwrite=overwrite, resume=resume, progress=progress, start=start)


def _refuse_nested(src: Path, out: Path) -> None:
    src_abs, out_abs = src.resolve(), out.resolve()
    if out_abs == src_abs or (src_abs in out_abs.parents and not any(
            part.startswith(".") for part in out_abs.relative_to(src_abs).parts)):
        raise PackError(f"{out}: the output folder is inside the source {src}, so the pack "
                        "would read its own output; choose an output folder outside it",
                        path=out)


def _pack_source(
    source: Source, out: str | os.PathLike[str], options: WriteOptions,
    pack_options: dict[str, Any], *, seed: int, shuffle: bool, num_workers: int | None,
    skip_bad: bool, overwrite: bool, resume: bool, progress: bool | None, start: float,
) -> PackSummary:
    if not skip_bad:
        _refuse_bad(source)
    if not source.samples:
        raise EmptySourceError(
            f"{source.root}: nothing to pack ({source.hidden_ignored} hidden entries ignored, "
            f"{source.excluded} files excluded by --include/--exclude, {len(source.bad)} bad "
            "inputs); point SRC at a folder that holds files", path=source.root)
    order = list(range(len(source.samples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    job = _Job([source.samples[i] for i in order], options.codec, options.level,
               bool(pack_options["check_images"]))
    identity = {"source": source.digest, "seed": seed, "shuffle": shuffle, "pack": pack_options}
    writer = ShardWriter(out, options, classes=source.classes, overwrite=overwrite,
                         resume=resume, identity=identity)
    bar = None
    try:
        begin, left_out, skipped = _resume_point(writer, job, source)
        bar = _Progress(sys.stderr.isatty() if progress is None else progress,
                        sum(len(s.paths) for s in job.stream),
                        sum(len(s.paths) for s in job.stream[:begin]))
        encoded = _encoded(job, begin, num_workers or _default_workers())
        stream, write = job.stream, writer.write_encoded
        labelled = ("image", "label") if source.classes is not None else None
        with contextlib.closing(encoded):
            for pos, (framed, failed, reason) in encoded:
                sample = stream[pos]
                if framed is not None:
                    write(sample.key, framed, labelled or sample.fields)
                elif skip_bad:
                    left_out.append(sample)
                    skipped += sample.bad(failed, reason or "")
                else:
                    raise BadInputError(
                        f"{sample.paths[failed]}: {reason}. Fix it and run the same command "
                        "with --resume, or add --skip-bad --resume to leave it out",
                        path=sample.paths[failed])
                bar.advance(len(sample.paths), sample.num_bytes)
        if writer.num_samples == 0:
            raise EmptySourceError(f"{source.root}: every sample was bad, nothing was packed",
                                   path=source.root)
        input_bytes = sum(s.num_bytes for s in job.stream) - sum(s.num_bytes for s in left_out)
        writer.info.update(seed=seed, shuffle=shuffle, input_bytes=input_bytes,
                           options={**pack_options, "skip_bad": skip_bad},
                           skipped=sorted([*source.bad, *skipped]))
        manifest = writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    this_run = job.stream[begin:]
    return PackSummary(
        out=str(out), samples=manifest.num_samples,
        files=sum(len(s.paths) for s in job.stream) - sum(len(s.paths) for s in left_out),
        shards=len(manifest.shards), input_bytes=input_bytes, output_bytes=manifest.num_bytes,
        ratio=manifest.num_bytes / max(input_bytes, 1), seconds=seconds,
        files_per_s=sum(len(s.paths) for s in this_run) / seconds,
        mb_per_s=sum(s.num_bytes for s in this_run) / 1e6 / seconds,
        hidden_ignored=source.hidden_ignored,
        skipped=tuple((f.path, f.reason) for f in manifest.skipped),
        imagefolder=source.classes is not None, resumed_samples=writer.num_resumed,
    )
