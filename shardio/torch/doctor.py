"""``shardio.doctor``: run a loader against a training step and say what bounds it.

It times a bounded number of steps (a simulated step of ``step_ms``, or the caller's
``step_fn``) and reports: the share of the loop's time spent waiting for data; the
*headspace* (steps/s with data loading removed: the same batches replayed from memory);
the stage that bounds the pipeline (from ``loader.stats()``, ``shardio.reading.telemetry``,
whose ``decode`` seconds include the transform: a few samples decoded here with and
without it split them into ``decode`` and ``transform``);
periodic stalls (one long wait every N batches, found in the per-step wait series);
files opened per sample (``shard_opens`` of ``loader.stats()``); and recommendations,
the first of which is applied and measured in the same run when the doctor can rebuild
the loader (a dataset path or a ``shardio.loader``). Any other iterable of batches (a
plain ``DataLoader``) is measured from outside: the wait per step; for a dataset of
files (``.samples`` or ``.imgs`` as ImageFolder has: one file opened per sample) it
also times some files read whole and the same samples through the dataset, to split a
sample's time into reading and the rest (decode, transforms) and say whether packing
with shardio would help, and by how much. Imports torch only through the loader it
builds; the plot needs Pillow.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

STEP_BOUND_PCT = 10.0
"""Below this share of the loop's time waiting for data, data is not the bottleneck."""
KEEP_BATCHES = 4
"""Batches kept to replay for the headspace (held, so a worker's ring adds slots)."""
STAGE_BOUND = {"read": "io", "decode": "decode", "transform": "transform",
               "collate": "collate", "handover": "handover"}
PROBE_FILES = 64
"""Files of a plain dataset of files read whole (and the same samples taken) to split
a sample's time into reading and the rest."""
READ_BOUND = 0.5
"""Reading a sample's file this share of its time or more names a plain loader ``io``."""
PROBE_SAMPLES = 8
"""Samples of a shardio dataset decoded in this process (after one to warm up) with and
without its transform, and at the model's size, when data bounds the loop: the loader
times decode and transform together, and what ``draft_size=`` saves depends on the
images (noise-like JPEGs spend their time in entropy decoding, which no scale skips)."""
PROBE_REPEATS = 5
"""Times each sample is decoded each way: the quickest counts (others' load only adds)."""
DRAFT_GAIN = 1.1
"""``draft_size=`` is advised only where the probe decoded this many times faster."""


def doctor(
    source: Any,
    *,
    step_ms: float | None = None,
    step_fn: Callable[[Any], Any] | None = None,
    num_steps: int = 100,
    batch_size: int = 64,
    num_workers: int | None = None,
    decode: str = "auto",
    image_size: int = 224,
    verify: bool = True,
) -> dict[str, Any]:
    """Measure ``source`` against a step and report where the time goes; a plain dict.

    Args:
        source: a shardio dataset path, a ``shardio.loader``, or any iterable of batches.
        step_ms: a simulated step of this many milliseconds (default 0 unless ``step_fn``).
        step_fn: called with each batch instead (the user's own training step).
        num_steps: steps to time (the first, with the workers' start, is left out).
        batch_size, num_workers, decode: for a dataset path, the loader to build.
        image_size: the side the model takes, to judge whether decoding at a smaller
            size (``draft_size=``) would do.
        verify: apply the first recommendation and measure the steps/s it gives.

    Returns:
        ``data_wait_pct``, ``steps_per_s``, ``headspace_steps_per_s``, ``bound`` (``"step"``
        or the data stage: ``"io"``, ``"decode"``, ``"transform"``, ``"collate"``,
        ``"handover"``, ``"data"`` where stages are unseen), ``stall_every`` (N or None),
        ``files_per_sample`` (shard opens per sample; 1 for a dataset of files),
        ``recommendations`` (each ``text``, ``change``, ``expected``, and for the first,
        verified, ``measured_ratio``), ``series`` (per-step waits and stage seconds);
        for a shardio loader that data bounds, what the decode probe measured:
        ``probe_samples``, ``transform_share`` (of decode and transform seconds),
        ``image_side`` and ``draft_speedup`` (decode at full size over at the model's);
        for a dataset of files also ``files_per_s``, ``read_share`` (of a sample's
        time in one process), ``samples_per_s_needed`` and ``packing_gain`` (the
        steps/s ratio packing could give at most).
    """
    if num_steps < 2:
        raise ValueError(f"num_steps must be 2 or more, got {num_steps}")

    def step(batch: Any) -> None:
        if step_fn is not None:
            step_fn(batch)
        elif step_ms:
            time.sleep(step_ms / 1e3)

    loader = _loader_for(source, batch_size=batch_size, num_workers=num_workers,
                         decode=decode)
    run = _measure(loader, step, num_steps)
    report: dict[str, Any] = {
        "loader": type(loader).__name__, "num_workers": getattr(loader, "num_workers", None),
        "steps": run["steps"], "data_wait_pct": run["wait_pct"],
        "steps_per_s": run["steps_per_s"], "first_batch_s": run["first_batch_s"],
        "headspace_steps_per_s": _headspace(run.pop("kept"), step, num_steps),
        "cpu_count": os.cpu_count() or 1,
    }
    report["stall_every"] = find_period(run["series"]["wait"][1:])
    dataset = getattr(loader, "dataset", None)
    if getattr(dataset, "decoder", None) is not None and (
            report["data_wait_pct"] >= STEP_BOUND_PCT):
        report.update(_probe_decode(dataset, image_size))
        _split_transform(run, report.get("transform_share", 0.0))
    report["stages_s"] = run["stages"]
    report["files_per_sample"] = _opens_per_sample(run, loader)
    probe = _probe_files(loader)
    if probe is not None:
        report.update(probe)
        report["files_per_sample"] = 1.0
        report["samples_per_s_needed"] = report["headspace_steps_per_s"] * _batch_of(loader)
        report["packing_gain"] = _packing_gain(report)
    report["bound"] = _bound(report, run)
    report["recommendations"] = _recommend(report, loader, image_size)
    first = next(iter(report["recommendations"]), None)
    if verify and first is not None and first["change"] and _rebuildable(loader):
        with tempfile.TemporaryDirectory(prefix="shardio-doctor-") as cold:
            changed = _rebuilt(loader, first["change"], Path(cold))
            for _ in zip(range(KEEP_BATCHES), changed, strict=False):  # warm, as the first
                pass
            after = _measure(changed, step, num_steps)
            del changed  # its workers and readers, before their cache folder goes
        first["measured_steps_per_s"] = after["steps_per_s"]
        first["measured_ratio"] = after["steps_per_s"] / report["steps_per_s"]
    report["series"] = run["series"]
    return report


def _loader_for(source: Any, *, batch_size: int, num_workers: int | None,
                decode: str) -> Iterable[Any]:
    if isinstance(source, (str, os.PathLike)):
        from shardio.torch.dataset import StreamingDataset
        from shardio.torch.loader import loader

        dataset = StreamingDataset(source, decode=decode)  # type: ignore[arg-type]
        return loader(dataset, batch_size, num_workers=num_workers)
    return source  # type: ignore[no-any-return]


def _measure(loader: Iterable[Any], step: Callable[[Any], None], num_steps: int
             ) -> dict[str, Any]:
    """Time ``num_steps`` steps of ``loader`` (epochs repeat); per-step waits and stages."""
    reset = getattr(loader, "reset_stats", None)
    if callable(reset):
        reset()
    waits: list[float] = []
    kept: list[Any] = []
    busy = 0.0
    while len(waits) < num_steps:
        before = len(waits)
        asked = time.perf_counter()
        for batch in loader:
            got = time.perf_counter()
            waits.append(got - asked)
            if len(kept) < KEEP_BATCHES:
                kept.append(batch)
            step(batch)
            del batch
            asked = time.perf_counter()
            busy += asked - got
            if len(waits) >= num_steps:
                break
        if len(waits) == before:
            raise ValueError(f"{type(loader).__name__} gave no batch: nothing to measure")
    series: dict[str, list[float]] = {"wait": waits}
    stages: dict[str, float] = {}
    opens = None
    inner = getattr(loader, "step_series", None)
    if callable(inner):
        for name, column in inner().items():
            if name == "shard_opens":
                opens = sum(column[:num_steps])
            elif name != "wait":
                series[name] = column[:num_steps]
                stages[name] = sum(column[1:num_steps])
    waited = sum(waits[1:])
    return {"steps": len(waits), "series": series, "stages": stages, "kept": kept,
            "opens": opens,
            "first_batch_s": waits[0],
            "wait_pct": 100.0 * waited / (waited + busy) if waited + busy else 0.0,
            "steps_per_s": (len(waits) - 1) / (waited + busy) if waited + busy else math.inf}


def _headspace(kept: list[Any], step: Callable[[Any], None], num_steps: int) -> float:
    """Steps/s of the step alone: the kept batches replayed from memory."""
    count = max(2, min(num_steps, 50))
    began = time.perf_counter()
    for i in range(count):
        step(kept[i % len(kept)])
    took = time.perf_counter() - began
    kept.clear()
    return count / took if took > 0 else math.inf


def _probe_decode(dataset: Any, image_size: int) -> dict[str, Any]:
    """Decode ``PROBE_SAMPLES`` samples of ``dataset`` in this process as its loader
    would, without its transforms, and (JPEGs twice the model's side or more) at the
    model's size: the transforms' share of the time, and how much faster the draft is.

    Empty where there is nothing to split or to draft, or the samples cannot be read
    here (the loader's own report stands, its ``decode`` seconds unsplit)."""
    from shardio.torch.dataset import StreamingDataset
    from shardio.torch.decoders import SampleDecoder

    decoder = dataset.decoder
    transformed = decoder.transform is not None or getattr(
        decoder, "target_transform", None) is not None
    draftable = isinstance(decoder, SampleDecoder) and decoder.mode in ("pil", "tensor") and (
        decoder.draft_size is None and decoder.cropper is None)
    if not (transformed or draftable):
        return {}
    bare = copy.copy(decoder)
    bare.transform = None
    if hasattr(bare, "target_transform"):
        bare.target_transform = None
    draft = None
    seconds = [0.0, 0.0, 0.0]  # without transforms, with them, at the model's size
    side, i = None, -1
    try:
        raw = StreamingDataset(dataset.path, decode="raw", shuffle=False,
                                       remote=getattr(dataset.reader, "remote", None))
        # the first sample warms up (imports, the decoder's first call) and is not counted
        for i, sample in enumerate(itertools.islice(raw, PROBE_SAMPLES + 1)):
            if i == 0 and draftable:
                side = _side(bare(sample)[0])
                if side >= 2 * image_size:  # JPEG scales by halves: nothing to gain below
                    draft = copy.copy(bare)
                    draft.draft_size = (image_size, image_size)
            for k, way in enumerate((bare, decoder, draft)):
                if i and way is not None:
                    seconds[k] += _quickest(way, sample)
    except (OSError, ValueError):  # DecodeError too: the loader names a bad sample itself
        return {}
    count = min(PROBE_SAMPLES, max(0, i))
    if not count:
        return {}
    out: dict[str, Any] = {"probe_samples": count}
    if transformed and seconds[1] > 0:
        out["transform_share"] = max(0.0, 1.0 - seconds[0] / seconds[1])
    if side is not None:
        out["image_side"] = side
    if draft is not None and seconds[2] > 0:
        out["draft_speedup"] = seconds[0] / seconds[2]
    return out


def _quickest(decode: Callable[[Any], Any], sample: Any) -> float:
    """The quickest of ``PROBE_REPEATS`` calls of ``decode(sample)``, in seconds; each
    call on a copy of the sample dict, which a transform of ``raw`` samples may change."""
    best = math.inf
    for _ in range(PROBE_REPEATS):
        fresh = dict(sample)
        began = time.perf_counter()
        decode(fresh)
        best = min(best, time.perf_counter() - began)
    return best


def _side(image: Any) -> int:
    """The long side of a PIL image (``size``) or a CHW tensor (``shape``)."""
    size = getattr(image, "size", None)
    return int(max(size if isinstance(size, tuple) else image.shape[-2:]))


def _split_transform(run: dict[str, Any], share: float) -> None:
    """Split the loader's ``decode`` seconds (decode and transforms together), per step
    and in total, into ``decode`` and ``transform`` by the share the probe measured."""
    if not share or "decode" not in run["stages"]:
        return
    for table in (run["stages"], run["series"]):
        split: dict[str, Any] = {}
        for name, value in table.items():
            if name != "decode":
                split[name] = value
            elif isinstance(value, list):
                split["decode"] = [x * (1 - share) for x in value]
                split["transform"] = [x * share for x in value]
            else:
                split["decode"], split["transform"] = value * (1 - share), value * share
        table.clear()
        table.update(split)


def find_period(waits: list[float]) -> int | None:
    """N when the waits show one long wait every N steps (N of 2 or more), else None.

    A long wait is over half the 95th percentile (and over 1 ms); the period is the
    most common gap between long waits, if at least 3 of 5 gaps have it.
    """
    if len(waits) < 8:
        return None
    high = sorted(waits)[int(0.95 * (len(waits) - 1))]
    spikes = [i for i, w in enumerate(waits) if w > max(1e-3, 0.5 * high)]
    gaps = [b - a for a, b in itertools.pairwise(spikes)]
    if len(gaps) < 3:
        return None
    period = statistics.mode(gaps)
    if period < 2 or gaps.count(period) < 0.6 * len(gaps):
        return None
    return period


def _bound(report: dict[str, Any], run: dict[str, Any]) -> str:
    if report["data_wait_pct"] < STEP_BOUND_PCT:
        return "step"
    stages = {k: v for k, v in run["stages"].items() if k in STAGE_BOUND}
    if "read_share" in report and not stages:  # a plain loader over files, seen from outside
        return "io" if report["read_share"] >= READ_BOUND else "decode"
    if not stages or max(stages.values()) <= 0:
        return "data"
    return STAGE_BOUND[max(stages, key=lambda k: stages[k])]


def _opens_per_sample(run: dict[str, Any], loader: Any) -> float | None:
    """Shard files opened per sample delivered. A shuffle window opens the shards it draws
    from before its first sample: a run shorter than the window counts each open against
    the samples its shard holds (all of which that window delivers)."""
    manifest = getattr(getattr(getattr(loader, "dataset", None), "reader", None),
                       "manifest", None)
    if run["opens"] is None or manifest is None:
        return None
    per_shard = manifest.num_samples / max(1, len(manifest.shards))
    samples = run["steps"] * _batch_of(loader)
    return float(run["opens"] / max(samples, run["opens"] * per_shard, 1))


def _batch_of(loader: Any) -> int:
    return int(getattr(loader, "batch_size", None) or 1)


def _probe_files(loader: Any) -> dict[str, float] | None:
    """For a dataset of files (``.samples``/``.imgs``, one file a sample): files/s read
    whole and the share of a sample's time (``dataset[i]`` in this process) that is.

    ``PROBE_FILES`` samples spread over the dataset, each file read first (so both
    timings find the same page cache: what is left is the dataset's own work)."""
    dataset: Any = getattr(loader, "dataset", None)
    files = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
    if not isinstance(files, list) or not files or not callable(
            getattr(dataset, "__getitem__", None)):
        return None
    picked = sorted({round(i * (len(files) - 1) / max(1, PROBE_FILES - 1))
                     for i in range(min(PROBE_FILES, len(files)))})
    paths = [files[i][0] if isinstance(files[i], tuple) else files[i] for i in picked]
    for path in paths:  # the first touch (a cold disk) is what a first epoch pays
        Path(path).read_bytes()
    began = time.perf_counter()
    for path in paths:
        Path(path).read_bytes()
    read_s = time.perf_counter() - began
    began = time.perf_counter()
    for i in picked:
        dataset[i]
    sample_s = time.perf_counter() - began
    return {"files_per_s": len(paths) / read_s if read_s > 0 else math.inf,
            "read_share": min(1.0, read_s / sample_s) if sample_s > 0 else 1.0}


def _packing_gain(report: dict[str, Any]) -> float:
    """Steps/s after packing over steps/s now, at most: only when data bounds the loop,
    and only the reading part of a sample's time goes (shards: one open per shard)."""
    if report["data_wait_pct"] < STEP_BOUND_PCT:
        return 1.0
    limit = report["headspace_steps_per_s"] / report["steps_per_s"]
    return float(max(1.0, min(limit, 1.0 / max(1e-3, 1.0 - report["read_share"]))))


def _recommend(report: dict[str, Any], loader: Any, image_size: int) -> list[dict[str, Any]]:
    """What to change, most useful first; ``change``: the loader keywords to apply."""
    bound, out = report["bound"], []
    if bound == "step":
        return [{"text": "data is not the bottleneck: the loop waits "
                 f"{report['data_wait_pct']:.1f}% of its time; speed up the step itself",
                 "change": {}, "expected": "none from data loading"}]
    workers = report["num_workers"]
    needed = report["steps_per_s"] and report["headspace_steps_per_s"] / report["steps_per_s"]
    dataset = getattr(loader, "dataset", None)
    speedup = report.get("draft_speedup")
    if bound == "decode" and speedup is not None and speedup >= DRAFT_GAIN:
        # the batch's worker seconds, less what the draft saves of decode's: steps/s
        # follow them while data bounds the loop (and never past the headspace)
        work = sum(report["stages_s"].values())
        left = work - report["stages_s"]["decode"] * (1 - 1 / speedup)
        gain = min(needed or math.inf, work / left if left > 0 else math.inf)
        out.append({"text": f"decode at the model's size: images are about "
                    f"{report['image_side']} px, the model takes {image_size}: "
                    f"StreamingDataset(..., draft_size=({image_size}, {image_size})) decodes "
                    "JPEGs at a reduced scale",
                    "change": {"draft_size": (image_size, image_size)},
                    "expected": f"decode {speedup:.1f}x faster ({report['probe_samples']} "
                    f"images decoded both ways here), so up to {gain:.2f}x steps/s"})
    # a stage of CPU work gains nothing from more workers than cores (the scale run of
    # bench_doctor, handover-bound, was slower with 4 workers on 2 cores than with 2);
    # reading and transforms may wait instead, and run past them
    cores = report["cpu_count"]
    limit = cores if bound in ("decode", "collate", "handover") else 2 * cores
    if isinstance(workers, int) and needed and needed > 1.1 and workers < limit:
        more = max(workers + 1, min(math.ceil(max(workers, 1) * needed), limit))
        why = (f"a long wait every {report['stall_every']} batches: the {workers} workers "
               "finish together and the loop drains them" if report["stall_every"]
               else f"the data gives {report['steps_per_s']:.1f} steps/s, the step alone "
               f"{report['headspace_steps_per_s']:.1f}")
        out.append({"text": f"more workers: num_workers={more} ({why})",
                    "change": {"num_workers": more},
                    "expected": f"up to {min(needed, more / max(workers, 1)):.1f}x steps/s, "
                    "while cores are free"})
    if "files_per_s" in report:
        gain = report["packing_gain"]
        packs = gain >= 1.1
        out.insert(0 if packs else len(out), {
            "text": f"one file opened per sample: the disk gives {report['files_per_s']:.0f} "
            f"files/s read whole, the step needs {report['samples_per_s_needed']:.0f} "
            f"samples/s, and reading is {100 * report['read_share']:.0f}% of a sample's time "
            f"(the rest: decode, transforms): packing with shardio (`shardio pack-imagefolder`"
            f", one open per shard) {'would' if packs else 'would not'} help",
            "change": {}, "expected": f"up to {gain:.1f}x steps/s" if packs else "none"})
    if bound == "io":
        out.extend(_io_advice(report, dataset))
    if bound == "decode":
        out.append({"text": "decode on the GPU: DevicePrefetcher(..., decode=shardio."
                    "DeviceDecoder(...)) moves JPEG decode off the workers", "change": {},
                    "expected": "decode off the CPU's critical path"})
    if not out and isinstance(workers, int):
        out.append({"text": f"{workers} workers already keep the {cores} cores busy with "
                    f"{bound}: no loader setting adds more of them; a lighter {bound} or "
                    "more cores would", "change": {}, "expected": "none from the loader"})
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and not getattr(
            loader, "pin_memory", True):
        out.append({"text": "pin_memory=True: copies to the GPU run asynchronously",
                    "change": {}, "expected": "H2D copy overlaps the step"})
    return out


def _io_advice(report: dict[str, Any], dataset: Any) -> list[dict[str, Any]]:
    """Reading bounds a shardio dataset: the node cache for remote data, and shard size."""
    out: list[dict[str, Any]] = []
    reader = getattr(dataset, "reader", None)
    manifest = getattr(reader, "manifest", None)
    if manifest is None:
        return out
    data_bytes = sum(s.num_bytes for s in manifest.shards)
    remote = getattr(reader, "remote", None)
    if remote is not None:
        budget = remote.max_cache_bytes or 0
        if budget < data_bytes:
            out.append({"text": f"the node cache holds {budget >> 20} MiB, less than the "
                        f"dataset's {data_bytes >> 20} MiB, so every epoch downloads it again: "
                        f"RemoteOptions(max_cache_bytes>={data_bytes}) (and a cache_dir on a "
                        "local disk) lets epochs after the first read local files",
                        "change": {}, "expected": "later epochs at local-disk speed"})
        else:
            out.append({"text": f"remote data: epochs after the first read the node cache "
                        f"({remote.cache_dir}); this run may have met it cold", "change": {},
                        "expected": "later epochs at local-disk speed"})
    per_shard = manifest.num_samples / max(1, len(manifest.shards))
    if (report["files_per_sample"] or 0) > 0.01 or per_shard < 100:
        out.append({"text": f"shards hold {per_shard:.0f} samples each "
                    f"({data_bytes // max(1, len(manifest.shards)) >> 10} KiB): re-pack with a "
                    "larger max_shard_bytes for fewer opens (and, remote, fewer requests)",
                    "change": {}, "expected": "fewer opens and requests per sample"})
    return out


def _rebuildable(loader: Any) -> bool:
    from shardio.torch.loader import ShardLoader

    return isinstance(loader, ShardLoader)


def _rebuilt(loader: Any, change: dict[str, Any], cold: Path) -> Any:
    """``loader`` (a ``shardio.loader``) with ``change`` applied, every other option of it
    and of its dataset kept.

    A change of the dataset's (``draft_size``) goes to a copy of the dataset, with a copy
    of its decoder. A remote dataset's copy reads through a reader of its own whose node
    cache is the empty ``cold``: the first run filled the real one, and a second run
    reading from it would credit the change with the cache."""
    from shardio.reading.reader import DatasetReader
    from shardio.torch.loader import loader as make_loader

    dataset = loader.dataset
    remote = dataset.reader.remote
    if "draft_size" in change or (isinstance(dataset.reader, DatasetReader) and remote):
        dataset = copy.copy(dataset)  # its epoch state stays shared, as one loader's would
        if "draft_size" in change:
            dataset.decoder = copy.copy(dataset.decoder)
            dataset.decoder.draft_size = change["draft_size"]
        if isinstance(dataset.reader, DatasetReader) and remote:
            dataset.reader = DatasetReader(dataset.reader.root, verify=dataset.reader.verify,
                                           remote=dataclasses.replace(remote, cache_dir=cold))
    workers = change.get("num_workers", loader.num_workers)
    # what shardio.loader resolved of the options it keeps no attribute for; with no
    # workers it records none of the workers' own, so those keep their defaults
    settings = getattr(loader, "_settings", {})
    kept = {k: settings[k] for k in ("pin_memory", "persistent_workers",
                                     "multiprocessing_context")
            if k in settings and (loader.num_workers or k == "pin_memory")}
    # no log_every: the user's logger is handed the loader they made, not the doctor's
    return make_loader(dataset, loader.batch_size, num_workers=workers,
                          collate_fn=loader.collate_fn, prefetch_factor=loader.prefetch_factor,
                          drop_last=loader.drop_last, **kept)


def format_report(report: dict[str, Any]) -> str:
    """The report as a few lines of text."""
    lines = [
        f"{report['steps']} steps of {report['loader']} "
        f"(num_workers={report['num_workers']}): {report['steps_per_s']:.1f} steps/s, "
        f"waiting for data {report['data_wait_pct']:.1f}% of the time",
        f"headspace (the step alone, batches from memory): "
        f"{report['headspace_steps_per_s']:.1f} steps/s",
        "bound by: " + ("the step (data is not the bottleneck)" if report["bound"] == "step"
                        else f"data loading, stage {report['bound']}"),
    ]
    if report["stages_s"]:
        lines.append("worker seconds per stage: " + ", ".join(
            f"{k} {v:.3f}" for k, v in report["stages_s"].items()))
    if report["stall_every"]:
        lines.append(f"periodic stall: a long wait every {report['stall_every']} batches")
    if "transform_share" in report:
        lines.append(f"transforms: {100 * report['transform_share']:.0f}% of the loader's "
                     f"decode seconds ({report['probe_samples']} samples decoded here with "
                     "and without them)")
    if report.get("files_per_sample") is not None:
        lines.append(f"files opened per sample: {report['files_per_sample']:.3g}")
    if "files_per_s" in report:
        lines.append(f"files read whole: {report['files_per_s']:.0f}/s; reading is "
                     f"{100 * report['read_share']:.0f}% of a sample's time; the step needs "
                     f"{report['samples_per_s_needed']:.0f} samples/s")
    for i, rec in enumerate(report["recommendations"], 1):
        lines.append(f"{i}. {rec['text']} — expected: {rec['expected']}")
        if "measured_ratio" in rec:
            lines.append(f"   applied here: {rec['measured_steps_per_s']:.1f} steps/s, "
                         f"{rec['measured_ratio']:.2f}x")
    return "\n".join(lines)


COLOURS = {"read": (70, 130, 180), "decode": (230, 140, 40), "transform": (200, 70, 70),
           "collate": (120, 180, 90),
           "handover": (170, 110, 190), "wait": (20, 20, 20)}


def draw_plot(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """A PNG: per step, the batch's stage seconds stacked (bars) and the wait (line)."""
    from PIL import Image, ImageDraw

    series = report["series"]
    waits = series["wait"][1:]
    stages = [k for k in COLOURS if k != "wait" and k in series]
    width, height, left, bottom = 900, 320, 50, 30
    top = max([*waits, *(sum(series[k][i + 1] for k in stages) for i in range(len(waits)))],
              default=0) or 1e-3
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    plot_w, plot_h = width - left - 10, height - bottom - 20
    dx = plot_w / max(1, len(waits))

    def y(seconds: float) -> float:
        return height - bottom - plot_h * seconds / top

    for i in range(len(waits)):
        base = 0.0
        for name in stages:
            value = series[name][i + 1]
            draw.rectangle([left + i * dx, y(base + value), left + (i + 1) * dx - 1, y(base)],
                           fill=COLOURS[name])
            base += value
    points = [(left + (i + 0.5) * dx, y(w)) for i, w in enumerate(waits)]
    if len(points) > 1:
        draw.line(points, fill=COLOURS["wait"], width=2)
    draw.line([left, height - bottom, width - 10, height - bottom], fill="black")
    draw.text((left, 4), f"per-step wait (line) and stage seconds (bars); top "
              f"{1e3 * top:.1f} ms; bound: {report['bound']}", fill="black")
    x = left
    for name in [*stages, "wait"]:
        draw.rectangle([x, height - 18, x + 10, height - 8], fill=COLOURS[name])
        draw.text((x + 14, height - 20), name, fill="black")
        x += 90
    image.save(path, format="PNG")
