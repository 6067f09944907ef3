"""Stress: does any damage to a dataset get past shardio, return wrong bytes, or kill it?

The question: for every kind of damage a dataset meets (single-bit flips anywhere in
a shard, truncation at a random length, a zeroed 4 KB page, two shard files exchanged,
one manifest field changed), does ``verify`` report a fault, does every reader either
raise a ``ShardioError`` or return exactly the original bytes, and does no process die
by a signal or hang?

Each case damages a working copy of a small labelled dataset (both backends, both
codecs), then, in a child process, runs ``verify``, ``unpack``, and reads every sample
through ``DatasetReader.get``, the streaming path (``shardio.reading.stream.iter_samples``, in
a shuffled order) and, unless ``--no-torch``, ``IndexedDataset`` and ``StreamingDataset``;
then restores the copy.
Children run many cases each (with the repository as working directory, so they import
the ``shardio`` beside this script: run it from a clean checkout to measure committed
code) and report one JSON line per case; a child that dies by
a signal or stops making progress for ``--case-timeout`` seconds is a crash of the case
it was running, the copy is restored and a fresh child goes on with the next case.

Outcomes per case: ``found`` (verify reported a fault), per reader ``exact`` (every
sample equal to the original), ``raised`` (a ``ShardioError``, and every sample returned
before it exact) or ``wrong`` (a sample that differs, one too many or one missing,
without an error); ``untyped`` (an exception that is not a ``ShardioError``) and
``crash``. The guarantee holds when every case is found and no case is wrong, untyped
or a crash.

    python -m benchmarks.stress_corruption      # writes benchmarks/results/corruption.json
    python -m benchmarks.stress_corruption --flips 200 --out /tmp/c.json    # a quick run

``tests/format/test_corruption_fuzz.py`` runs the same cases, fewer of them, in the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

import numpy as np

REPO: Final = Path(__file__).resolve().parent.parent
RESULT: Final = REPO / "benchmarks" / "results" / "corruption.json"
PAGE_BYTES: Final = 4096
READERS: Final = ("get", "stream", "indexed", "streaming")
Case = dict[str, Any]
"""One damage, as JSON: ``{"kind": "flip", "file": "shard-00001.rec", "bit": 8123}`` and
the like (kinds: flip, truncate, zero, swap, manifest)."""


# --- the dataset ------------------------------------------------------------------------


def make_dataset(root: Path, *, backend: str, codec: str, num_samples: int = 24,
                 per_shard: int = 6, seed: int = 0) -> None:
    """A labelled dataset: half JPEG-like images (stored raw), half compressible ones.

    Every fourth image is 5-12 KB, larger than a page: LMDB keeps it on overflow pages,
    whose damaged page numbers and sizes are what can lead liblmdb past the file's end.
    """
    from shardio import ShardWriter, WriteOptions

    rng = np.random.default_rng(seed)
    classes = ["ant", "bee", "cat"]
    options = WriteOptions(backend=backend, codec=codec, max_shard_samples=per_shard)
    with ShardWriter(root, options, classes=classes) as writer:
        for i in range(num_samples):
            size = int(rng.integers(5000, 12000) if i % 4 == 3 else rng.integers(200, 1500))
            if i % 2:
                # a JPEG's frame (start, a scan header, random image data, end marker): whole
                # to verify's structure check, which must see only the damage of each case
                image = (b"\xff\xd8\xff\xda\x00\x02" + rng.integers(0, 256, size, np.uint8)
                         .tobytes() + b"\xff\xd9")
            else:
                image = (f"image {i} of class {i % 3} " * (size // 20)).encode()
            writer.write({"__key__": f"{classes[i % 3]}/{i:04d}.jpg", "image": image,
                          "label": i % 3})


def shard_files(root: Path) -> list[str]:
    """The shard file names of the dataset at ``root``, in manifest order."""
    manifest = json.loads((root / "manifest.json").read_text())
    return [s["name"] for s in manifest["shards"]]


# --- the cases --------------------------------------------------------------------------


def flip_cases(root: Path, num: int, rng: np.random.Generator) -> list[Case]:
    """``num`` single-bit flips, each at a uniformly random bit of the dataset's shards."""
    names = shard_files(root)
    sizes = np.array([(root / n).stat().st_size for n in names])
    bits = rng.integers(0, int(sizes.sum()) * 8, num)
    ends = np.cumsum(sizes) * 8
    out = []
    for bit in bits.tolist():
        i = int(np.searchsorted(ends, bit, side="right"))
        out.append({"kind": "flip", "file": names[i], "bit": bit - int(ends[i] - sizes[i] * 8)})
    return out


def truncate_cases(root: Path, num: int, rng: np.random.Generator) -> list[Case]:
    """A shard cut at a random length (0 to one byte short)."""
    names = shard_files(root)
    out = []
    for _ in range(num):
        name = names[int(rng.integers(len(names)))]
        size = (root / name).stat().st_size
        out.append({"kind": "truncate", "file": name, "size": int(rng.integers(0, size))})
    return out


def zero_cases(root: Path) -> list[Case]:
    """Every 4 KB page of every shard, zeroed in turn (a lost or unwritten page)."""
    return [{"kind": "zero", "file": name, "page": page}
            for name in shard_files(root)
            for page in range(-(-(root / name).stat().st_size // PAGE_BYTES))]


def swap_cases(root: Path) -> list[Case]:
    """Every pair of shard files exchanged (a copy or rename gone wrong)."""
    names = shard_files(root)
    return [{"kind": "swap", "files": [a, b]} for i, a in enumerate(names) for b in names[i + 1:]]


def manifest_cases(root: Path) -> list[Case]:
    """One manifest field changed per case: counts, sizes, checksums, names, classes…"""
    m = json.loads((root / "manifest.json").read_text())
    n = len(m["shards"])
    classes = m["classes"]
    edits: list[tuple[list[Any], Any]] = [
        (["num_samples"], m["num_samples"] + 1), (["num_samples"], m["num_samples"] - 1),
        (["num_bytes"], m["num_bytes"] + 1), (["fields"], ["image"]),
        (["fields"], [*m["fields"], "extra"]), (["classes"], [classes[0] + "x", *classes[1:]]),
        (["classes"], classes[:-1]), (["classes"], classes[::-1]),
        (["class_to_idx", classes[0]], 1), (["version"], m["version"] + 1), (["format"], "other"),
        (["backend"], "lmdb" if m["backend"] == "records" else "records"),
    ]
    if m["codec"] == "zstd":  # "none" -> "zstd" changes nothing a reader or verify can see
        edits.append((["codec"], "none"))
    for s in (0, n - 1):
        shard = m["shards"][s]
        other = m["shards"][(s + 1) % n]["name"]
        digit = shard["checksum"][-1]
        edits += [
            (["shards", s, "num_samples"], shard["num_samples"] + 1),
            (["shards", s, "num_samples"], shard["num_samples"] - 1),
            (["shards", s, "first_index"], shard["first_index"] + 1),
            (["shards", s, "num_bytes"], shard["num_bytes"] - 1),
            (["shards", s, "checksum"], shard["checksum"][:-1] + ("0" if digit != "0" else "1")),
            (["shards", s, "name"], other),
            (["shards", s, "name"], "shard-99999" + Path(shard["name"]).suffix),
        ]
    return [{"kind": "manifest", "path": path, "value": value} for path, value in edits]


def hostile_manifest_cases(root: Path) -> list[Case]:
    """Manifests that claim counts and sizes no shard can hold, consistent with themselves.

    A crafted manifest keeps its sums right: a shard claiming 10^10 samples comes with
    the total and every later ``first_index`` moved to match. A reader must refuse each
    when it reads the manifest, never plan or allocate for what a count only claims
    (10^10 samples is 74.5 GiB of order; 10^7 fits in memory and is refused all the same).
    """
    m = json.loads((root / "manifest.json").read_text())
    shards = m["shards"]
    cases: list[Case] = []
    for claim in (10**7, 10**10, 2**62, -1):
        grow = claim - shards[0]["num_samples"]
        edits: list[list[Any]] = [[["shards", 0, "num_samples"], claim],
                                  [["num_samples"], m["num_samples"] + grow]]
        edits += [[["shards", s, "first_index"], shards[s]["first_index"] + grow]
                  for s in range(1, len(shards))]
        cases.append({"kind": "hostile", "edits": edits})
        last = len(shards) - 1
        cases.append({"kind": "hostile", "edits": [
            [["shards", last, "num_samples"], claim],
            [["num_samples"], m["num_samples"] - shards[last]["num_samples"] + claim]]})
        grow = claim - shards[0]["num_bytes"]
        cases.append({"kind": "hostile", "edits": [[["shards", 0, "num_bytes"], claim],
                                                  [["num_bytes"], m["num_bytes"] + grow]]})
    cases += [{"kind": "hostile", "edits": [[["shards", 0, "num_samples"], "6"]]},
              {"kind": "hostile", "edits": [[["num_samples"], 1.5]]},
              {"kind": "hostile", "edits": [[["num_samples"], m["num_samples"] * 10_000],
                                            [["shards"], shards * 10_000]]}]
    return cases


# --- damaging and restoring a working copy ----------------------------------------------


def _replace(path: Path, data: bytes) -> None:
    """Give ``path`` new contents as a new file: a map of the old one that the previous
    case's reader or checker thread still holds stays valid (truncating it in place would
    be a SIGBUS of the harness's making, not of the damage)."""
    temporary = path.with_name(path.name + ".stress-tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def apply_case(root: Path, case: Case) -> None:
    """Damage the dataset at ``root`` as ``case`` says."""
    kind = case["kind"]
    if kind == "flip":
        path = root / case["file"]
        data = bytearray(path.read_bytes())
        data[case["bit"] // 8] ^= 1 << (case["bit"] % 8)
        _replace(path, bytes(data))
    elif kind == "truncate":
        path = root / case["file"]
        _replace(path, path.read_bytes()[: case["size"]])
    elif kind == "zero":
        path = root / case["file"]
        data = bytearray(path.read_bytes())
        start = case["page"] * PAGE_BYTES
        data[start : start + PAGE_BYTES] = bytes(len(data[start : start + PAGE_BYTES]))
        _replace(path, bytes(data))
    elif kind == "swap":
        a, b = (root / f for f in case["files"])
        data_a = a.read_bytes()
        _replace(a, b.read_bytes())
        _replace(b, data_a)
    elif kind == "selftest":  # the harness's own test: a child that dies or hangs here
        if case["do"] == "sigbus":
            os.kill(os.getpid(), signal.SIGBUS)
        time.sleep(3600)
    elif kind in ("manifest", "hostile"):
        path = root / "manifest.json"
        m = json.loads(path.read_text())
        for steps, value in case.get("edits", [[case.get("path"), case.get("value")]]):
            node = m
            for step in steps[:-1]:
                node = node[step]
            node[steps[-1]] = value
        _replace(path, json.dumps(m).encode())
    else:
        raise ValueError(f"unknown case kind {kind!r}")


def touched(case: Case) -> list[str]:
    """The files ``case`` changes."""
    if case["kind"] == "swap":
        return list(case["files"])
    if case["kind"] == "selftest":
        return []
    return ["manifest.json"] if case["kind"] in ("manifest", "hostile") else [case["file"]]


def restore(work: Path, pristine: Path, names: list[str] | None = None) -> None:
    """Make ``work`` an exact copy of ``pristine`` again (only ``names``, when given)."""
    for name in names if names is not None else os.listdir(pristine):
        _replace(work / name, (pristine / name).read_bytes())
    for extra in set(os.listdir(work)) - set(os.listdir(pristine)):
        path = work / extra
        shutil.rmtree(path) if path.is_dir() else path.unlink()


# --- checking one damaged dataset (in the child) ----------------------------------------


def _plain(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: bytes(v) if isinstance(v, memoryview) else v
            for k, v in sample.items() if k != "__index__"}


Read = Callable[[], Iterator[tuple[int, "dict[str, Any] | None"]]]
"""A reader run: ``(index, sample)`` per sample, ``None`` for one that raised a ShardioError."""


def _read_outcome(read: Read, clean: list[dict[str, Any]]) -> str:
    """``exact``, ``raised``, ``wrong`` or ``untyped`` for one reader over every sample."""
    from shardio.errors import ShardioError

    count = 0
    raised = False
    try:
        for index, sample in read():
            count += 1
            if sample is None:
                raised = True
            elif not 0 <= index < len(clean) or _plain(sample) != clean[index]:
                return "wrong"
    except ShardioError:
        return "raised"
    except Exception:  # any other type is exactly what this counts
        return "untyped"
    if count != len(clean):
        return "wrong"  # a sample missing or one too many, and no error said so
    return "raised" if raised else "exact"


def check_dataset(root: Path, clean: list[dict[str, Any]], *, torch: bool, unpack_to: Path | None
                  ) -> dict[str, Any]:
    """Run verify, every reader and (into ``unpack_to``) unpack over the dataset at ``root``."""
    from shardio.errors import ShardioError
    from shardio.ops.unpack import unpack
    from shardio.ops.verify import verify
    from shardio.reading.reader import DatasetReader
    from shardio.reading.stream import iter_samples

    out: dict[str, Any] = {}
    try:
        report = verify(root)
        out["found"] = not report.ok
        out["fault"] = report.faults[0].message[-160:] if report.faults else ""
    except Exception as exc:  # verify must report, never raise
        out["found"], out["fault"] = False, f"verify raised {type(exc).__name__}: {exc}"
        out["untyped"] = True

    def by_get() -> Iterator[tuple[int, dict[str, Any] | None]]:
        with DatasetReader(root) as reader:  # each sample on its own: one bad one stops nothing
            for i in range(max(len(reader), len(clean))):
                try:
                    yield i, reader.get(i)
                except IndexError:
                    return
                except ShardioError:
                    yield i, None

    def by_stream() -> Iterator[tuple[int, dict[str, Any] | None]]:
        with DatasetReader(root) as reader:
            order = np.random.default_rng(len(clean)).permutation(len(reader))
            for sample in iter_samples(reader, order, window=8, max_run=4):
                yield sample["__index__"], sample

    def by_indexed() -> Iterator[tuple[int, dict[str, Any] | None]]:
        from shardio.torch.indexed import IndexedDataset

        dataset = IndexedDataset(root, decode="raw")
        # in batches of a random order, as a DataLoader's sampler asks (its blocks decoded
        # ahead on the checker thread); a batch that raises is asked again one by one
        order = np.random.default_rng(len(clean) + 1).permutation(len(dataset)).tolist()
        try:
            for at in range(0, len(order), 8):
                batch = order[at : at + 8]
                try:
                    yield from zip(batch, dataset.__getitems__(batch), strict=True)
                    continue
                except ShardioError:
                    pass
                for i in batch:
                    try:
                        yield i, dataset[i]
                    except ShardioError:
                        yield i, None
        finally:
            dataset.close()

    def by_streaming() -> Iterator[tuple[int, dict[str, Any] | None]]:
        from shardio.torch.dataset import StreamingDataset

        for sample in StreamingDataset(root, decode="raw", seed=len(clean)):
            yield sample["__index__"], sample

    readers: dict[str, Read] = {"get": by_get, "stream": by_stream, "indexed": by_indexed,
                                "streaming": by_streaming}
    for name in READERS if torch else READERS[:2]:
        out[name] = _read_outcome(readers[name], clean)
    if unpack_to is None:
        return out
    try:
        unpack(root, unpack_to)
        out["unpack"] = "ok"
    except (ShardioError, OSError):
        out["unpack"] = "raised"
    except Exception:  # an untyped error is what this counts
        out["unpack"] = "untyped"
    shutil.rmtree(unpack_to, ignore_errors=True)
    return out


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(job_path: str) -> None:
    """Run the cases of a job file from ``start``, one JSON line each; see ``run_cases``."""
    from shardio.reading.reader import DatasetReader

    job = json.loads(Path(job_path).read_text())
    if job["torch"]:  # imported before the first case, so that its memory is no case's growth
        import shardio.torch.dataset  # noqa: F401
    work, pristine, scratch = Path(job["work"]), Path(job["pristine"]), Path(job["scratch"])
    with DatasetReader(pristine) as reader:
        clean = [_plain(sample) for sample in reader]
    with open(job["progress"], "a") as progress, open(job["results"], "a") as results:
        for n in range(job["start"], len(job["cases"])):
            case = job["cases"][n]
            progress.write(f"{n}\n")
            progress.flush()
            apply_case(work, case)
            peak = _peak_rss_mb()
            outcome = check_dataset(work, clean, torch=job["torch"],
                                    unpack_to=scratch / "unpacked" if job["unpack"] else None)
            outcome["rss_growth_mb"] = round(_peak_rss_mb() - peak, 1)
            restore(work, pristine, touched(case))
            results.write(json.dumps({"n": n, **outcome}) + "\n")
            results.flush()


# --- header bombs: small files whose headers claim huge sizes ---------------------------

BOMB_LIMIT_AS: Final = 6 << 30
"""The address space a bomb child may map: a reader that allocates what a header claims
(up to 12.9 GB for one JPEG) gets a ``MemoryError`` there, counted, not the machine's OOM."""
ALLOCATED_MB: Final = 256
"""Peak memory growth over which a reader counts as having allocated what a header claimed
(a legal sample here is a few KB; the smallest claim tried is 1.1 GiB)."""
IMAGE_READERS: Final = ("tensor", "pil", "fields", "crop", "workers", "indexed", "device",
                        "preview")
FIELD_READERS: Final = ("fields", "workers")


def _tiny_jpeg(seed: int) -> bytes:
    from io import BytesIO

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (16, 16, 3), np.uint8)
    out = BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def jpeg_claiming(height: int, width: int) -> bytes:
    """A real 16x16 JPEG whose frame header (SOF0) says ``height`` x ``width``."""
    data = bytearray(_tiny_jpeg(0))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def png_claiming(height: int, width: int) -> bytes:
    """A real 16x16 PNG whose IHDR says ``height`` x ``width`` (its CRC made to match)."""
    import zlib
    from io import BytesIO

    from PIL import Image

    out = BytesIO()
    Image.new("RGB", (16, 16), (9, 99, 199)).save(out, "PNG")
    data = bytearray(out.getvalue())
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def npy_claiming(shape: tuple[int, ...]) -> bytes:
    """A ``.npy`` file whose header says ``shape`` of float64, with 8 bytes of data."""
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(8)


def bomb_cases() -> list[Case]:
    """Images claiming up to JPEG's and PNG's largest sizes; .npy shapes; nested JSON."""
    cases: list[Case] = [{"kind": "bomb", "make": "jpeg", "claim": [h, w]} for h, w in
                         ((20000, 20000), (50000, 50000), (65535, 65535), (65535, 8), (8, 65535))]
    cases += [{"kind": "bomb", "make": "png", "claim": [h, w]} for h, w in
              ((30000, 30000), (2**31 - 1, 2**31 - 1), (1, 2**31 - 1))]
    cases += [{"kind": "bomb", "make": "npy", "claim": list(shape)} for shape in
              ((10**10,), (50000, 50000), (2**31, 2**31), (0, 2**62))]
    cases += [{"kind": "bomb", "make": "json", "claim": [depth]} for depth in (10**4, 10**6)]
    return cases


def make_bomb_dataset(root: Path, case: Case) -> None:
    """Six samples; the fourth holds the bomb (an image field, or ``x.npy`` / ``meta.json``)."""
    from shardio import ShardWriter, WriteOptions

    make, claim = case["make"], case["claim"]
    classes = ["a", "b"] if make in ("jpeg", "png") else None
    with ShardWriter(root, WriteOptions(max_shard_samples=4), classes=classes) as writer:
        for i in range(6):
            bomb = i == 3
            if make in ("jpeg", "png"):
                image = _tiny_jpeg(i)
                if bomb:
                    image = jpeg_claiming(*claim) if make == "jpeg" else png_claiming(*claim)
                suffix = "png" if bomb and make == "png" else "jpg"
                writer.write({"__key__": f"{'ab'[i % 2]}/{i:04d}.{suffix}", "image": image,
                              "label": i % 2})
            else:
                npy = npy_claiming(tuple(claim)) if bomb and make == "npy" else npy_claiming((1,))
                depth = claim[0] if bomb and make == "json" else 2
                meta = ("[" * depth + "]" * depth).encode()
                writer.write({"__key__": f"s{i:04d}", "x.npy": npy, "meta.json": meta,
                              "cls": i % 2})


def check_bomb(root: Path, case: Case) -> dict[str, Any]:
    """Every decode path over the bomb dataset: how each ended, and its peak memory growth."""
    import resource

    import torch

    import shardio
    from shardio.errors import DecodeError, ShardioError

    image = case["make"] in ("jpeg", "png")

    def run_all(dataset: Any) -> None:
        for _ in dataset:
            pass

    def workers() -> None:
        if image:
            dataset = shardio.StreamingDataset(root, decode="tensor", batch_size=3,
                                               crop=shardio.CenterCrop(8), shuffle=False)
        else:
            dataset = shardio.StreamingDataset(root, fields=("x.npy", "meta.json", "cls"),
                                               batch_size=3, shuffle=False)
        run_all(torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2))

    def device() -> None:
        decoder = shardio.DeviceDecoder("cpu")
        dataset = shardio.StreamingDataset(root, decode="raw", shuffle=False)
        for batch in shardio.loader(dataset, 3, num_workers=0):
            decoder(batch)

    def preview() -> None:  # a contact sheet draws a bad image as a named placeholder
        from shardio.ops.preview import make_sheet

        problems = make_sheet(root, n=6).problems
        if problems:
            raise DecodeError(problems[0])

    def indexed() -> None:
        dataset = shardio.IndexedDataset(root, decode="tensor")
        for i in range(len(dataset)):
            dataset[i]

    paths: dict[str, Callable[[], None]] = {
        "tensor": lambda: run_all(shardio.StreamingDataset(root, decode="tensor")),
        "pil": lambda: run_all(shardio.StreamingDataset(root, decode="pil")),
        "fields": lambda: run_all(shardio.StreamingDataset(
            root, fields=("image", "label") if image else ("x.npy", "meta.json", "cls"),
            decode="tensor")),
        "crop": lambda: run_all(shardio.StreamingDataset(root, decode="tensor",
                                                         crop=shardio.CenterCrop(8))),
        "workers": workers, "indexed": indexed, "device": device,
        "preview": preview,
    }
    out: dict[str, Any] = {}
    growth = 0.0
    for name in IMAGE_READERS if image else FIELD_READERS:
        before = max(_peak_rss_mb(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                     / 1024)
        try:
            paths[name]()
            out[name] = "decoded"  # the bomb read as data: no path may do that
        except ShardioError:
            out[name] = "raised"
        except Exception as exc:  # any other type is exactly what this counts
            out[name] = "untyped"
            out.setdefault("fault", f"{name}: {type(exc).__name__}: {str(exc)[:120]}")
        after = max(_peak_rss_mb(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
        growth = max(growth, after - before)
    out["rss_growth_mb"] = round(growth, 1)
    return out


def bomb_child_main(case_json: str) -> None:
    """Check one bomb case's dataset (built by the parent), under ``BOMB_LIMIT_AS``."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (BOMB_LIMIT_AS, BOMB_LIMIT_AS))
    job = json.loads(case_json)
    print(json.dumps(check_bomb(Path(job["root"]), job["case"])))


def run_bombs(cases: list[Case], *, case_timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Each bomb case in a fresh child; one killed by a signal or stuck is a ``crash``."""
    outcomes = []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="shardio-bomb-") as tmp:
            root = Path(tmp) / "ds"
            make_bomb_dataset(root, case)
            job = json.dumps({"root": str(root), "case": case})
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.stress_corruption", "--bomb-child", job],
                    cwd=REPO, capture_output=True, text=True, timeout=case_timeout_s)
            except subprocess.TimeoutExpired:
                outcomes.append({"crash": True, "fault": f"no answer in {case_timeout_s} s"})
                continue
            if done.returncode != 0:
                outcomes.append({"crash": True, "fault": f"child exit {done.returncode}: "
                                 f"{done.stderr[-300:]}"})
                continue
            outcomes.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return outcomes


# --- running cases in children (in the parent) ------------------------------------------


def run_cases(pristine: Path, cases: list[Case], *, torch: bool = False, unpack: bool = True,
              case_timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Every case's outcome, in order; a child killed by a signal or stuck is a ``crash``.

    ``pristine`` is never changed: cases damage a copy, restored after each.
    """
    with tempfile.TemporaryDirectory(prefix="shardio-stress-") as tmp:
        base = Path(tmp)
        work, scratch = base / "work", base / "scratch"
        shutil.copytree(pristine, work)
        scratch.mkdir()
        progress, results = base / "progress", base / "results"
        progress.touch()
        results.touch()
        outcomes: dict[int, dict[str, Any]] = {}
        start = 0
        while start < len(cases):
            job = base / "job.json"
            job.write_text(json.dumps({
                "work": str(work), "pristine": str(pristine), "scratch": str(scratch),
                "progress": str(progress), "results": str(results), "cases": cases,
                "start": start, "torch": torch, "unpack": unpack,
            }))
            returncode = _run_child(job, progress, base / "stderr", case_timeout_s)
            for line in results.read_text().splitlines():
                record = json.loads(line)
                outcomes[record.pop("n")] = record
            if returncode == 0:
                break
            started = [int(x) for x in progress.read_text().split()]
            if not started or started[-1] in outcomes:
                tail = (base / "stderr").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"stress child failed outside a case (exit {returncode}):\n"
                                   f"{tail}")
            dead = started[-1]
            outcomes[dead] = {"found": None, "crash": True,
                              "fault": f"child exit {returncode}" if returncode is not None
                              else f"no progress in {case_timeout_s} s"}
            restore(work, pristine)
            start = dead + 1
    return [outcomes[n] for n in range(len(cases))]


def _run_child(job: Path, progress: Path, stderr: Path, case_timeout_s: float) -> int | None:
    """Run one child over ``job``; its exit status, or ``None`` when it hung and was killed."""
    with open(stderr, "ab") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.stress_corruption", "--child", str(job)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
        )
    seen, since = -1, time.monotonic()
    while True:
        try:
            return child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            now = len(progress.read_text().split())
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > case_timeout_s:
                child.kill()
                child.wait()
                return None


# --- summary and report -----------------------------------------------------------------


def summarize(cases: list[Case], outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per damage kind: tried, found by verify, each reader's outcomes, crashes."""
    kinds: dict[str, Counter[str]] = {}
    misses: list[dict[str, Any]] = []
    for case, out in zip(cases, outcomes, strict=True):
        c = kinds.setdefault(case["kind"], Counter())
        c["tried"] += 1
        c["found"] += bool(out.get("found"))
        c["crashes"] += bool(out.get("crash"))
        outcomes_read = [out.get(r) for r in READERS if r in out]
        c["wrong_bytes"] += "wrong" in outcomes_read
        c["untyped_errors"] += "untyped" in outcomes_read or out.get("unpack") == "untyped" or (
            bool(out.get("untyped")))
        c["readers_raised"] += "raised" in outcomes_read
        c["readers_exact"] += bool(outcomes_read) and all(o == "exact" for o in outcomes_read)
        c["allocated"] += out.get("rss_growth_mb", 0) > ALLOCATED_MB
        bad = (not out.get("found") or out.get("crash") or "wrong" in outcomes_read
               or "untyped" in outcomes_read or out.get("unpack") == "untyped"
               or out.get("rss_growth_mb", 0) > ALLOCATED_MB)
        if bad and len(misses) < 20:
            misses.append({"case": case, "outcome": out})
    fields = ("tried", "found", "readers_raised", "readers_exact", "wrong_bytes",
              "untyped_errors", "crashes", "allocated")
    by_kind = {k: {f: int(c[f]) for f in fields} for k, c in kinds.items()}
    total = {f: sum(v[f] for v in by_kind.values()) for f in fields}
    return {"total": total, "by_kind": by_kind, "misses": misses}


def summarize_bombs(cases: list[Case], outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per bomb kind (jpeg, png, npy, json), in ``summarize``'s fields.

    A bomb is ``found`` when every decode path raised a ``ShardioError``; ``wrong_bytes``
    counts cases where a path read it as data.
    """
    kinds: dict[str, Counter[str]] = {}
    misses: list[dict[str, Any]] = []
    for case, out in zip(cases, outcomes, strict=True):
        c = kinds.setdefault(case["make"], Counter())
        paths = [v for k, v in out.items() if k in IMAGE_READERS]
        c["tried"] += 1
        c["found"] += bool(paths) and all(v == "raised" for v in paths)
        c["readers_raised"] += "raised" in paths
        c["wrong_bytes"] += "decoded" in paths
        c["untyped_errors"] += "untyped" in paths
        c["crashes"] += bool(out.get("crash"))
        c["allocated"] += out.get("rss_growth_mb", 0) > ALLOCATED_MB
        c["max_growth_mb"] = max(c["max_growth_mb"], int(out.get("rss_growth_mb", 0)))
        if (not paths or set(paths) != {"raised"} or out.get("rss_growth_mb", 0) > ALLOCATED_MB
                ) and len(misses) < 20:
            misses.append({"case": case, "outcome": out})
    return {"by_kind": {k: dict(c) for k, c in kinds.items()}, "misses": misses}


def all_cases(root: Path, *, flips: int, truncations: int, rng: np.random.Generator
              ) -> list[Case]:
    """Every case for one dataset: flips, truncations, zeroed pages, swaps, manifest edits."""
    return (flip_cases(root, flips, rng) + truncate_cases(root, truncations, rng)
            + zero_cases(root) + swap_cases(root) + manifest_cases(root)
            + hostile_manifest_cases(root))


def run(*, flips: int, truncations: int, seed: int, torch: bool, case_timeout_s: float,
        command: str) -> dict[str, Any]:
    """Every backend × codec: build the dataset, run its cases, summarize."""
    from benchmarks.machine import describe_machine, library_versions, source_id

    started = time.perf_counter()
    configs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="shardio-stress-data-") as tmp:
        for backend in ("records", "lmdb"):
            for codec in ("zstd", "none"):
                root = Path(tmp) / f"{backend}-{codec}"
                make_dataset(root, backend=backend, codec=codec, seed=seed)
                rng = np.random.default_rng([seed, len(configs)])
                cases = all_cases(root, flips=flips, truncations=truncations, rng=rng)
                outcomes = run_cases(root, cases, torch=torch, case_timeout_s=case_timeout_s)
                configs[f"{backend}/{codec}"] = summarize(cases, outcomes)
                print(f"{backend}/{codec}: {configs[f'{backend}/{codec}']['total']}",
                      file=sys.stderr)
        machine = describe_machine(Path(tmp))
    bombs = bomb_cases() if torch else []
    bomb_summary = summarize_bombs(bombs, run_bombs(bombs))
    print(f"bombs: {bomb_summary['by_kind']}", file=sys.stderr)
    fields = next(iter(configs.values()))["total"].keys()
    return {
        "question": "does any damage get past verify, make a reader return wrong bytes, "
                    "or kill a process by a signal or hang?",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "seed": seed,
        "readers": [*(READERS if torch else READERS[:2]), "verify", "unpack"],
        "dataset": "24 labelled samples of 0.2-12 KB (one in four on LMDB overflow pages), "
                   "4 shards of 6; half JPEG-like (stored raw), half compressible (zstd); "
                   "one per backend x codec",
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine,
        "libraries": {k: v for k, v in library_versions().items() if k in ("shardio", "lmdb",
                      "numpy", "torch")},
        "python": platform.python_version(),
        "shardio_source": source_id(REPO / "shardio"),
        "total": {f: sum(c["total"][f] for c in configs.values()) for f in fields},
        "configs": configs,
        "bomb_readers": list(IMAGE_READERS),
        "bombs": bomb_summary,
    }


def render_guarantees(results: dict[str, Any]) -> str:
    """The README's tables of what the stress run tried and what it found."""
    rows = ["| damage | tried | found by verify | readers raised | readers exact "
            "| wrong bytes or untyped errors | allocated what it claimed | crashes |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    names = {"flip": "single-bit flip", "truncate": "truncation", "zero": "zeroed 4 KB page",
             "swap": "two shards exchanged", "manifest": "one manifest field changed",
             "hostile": "a count or size no shard can hold"}
    for kind, name in names.items():
        c = Counter[str]()
        for config in results["configs"].values():
            c.update(config["by_kind"].get(kind, {}))
        if c["tried"]:
            rows.append(f"| {name} | {c['tried']:,} | {c['found']:,} | {c['readers_raised']:,} "
                        f"| {c['readers_exact']:,} | {c['wrong_bytes'] + c['untyped_errors']:,} "
                        f"| {c['allocated']:,} | {c['crashes']:,} |")
    t = results["total"]
    text = "\n".join(rows) + (
        f"\n\n{t['tried']:,} damaged datasets ({', '.join(results['configs'])}; "
        f"{results['dataset']}), seed {results['seed']}, {results['date'][:10]}; readers: "
        f"{', '.join(results['readers'])}. *Readers exact*: the damage did not touch what "
        "they read (verify still reports it). *Allocated what it claimed*: a reader's peak "
        f"memory grew by more than {ALLOCATED_MB} MiB. Reproduce: "
        f"`{results['command'].strip()}`.\n"
    )
    bombs = results.get("bombs", {}).get("by_kind", {})
    if not bombs:
        return text
    rows = ["| header bomb | tried | every path raised | read as data or untyped "
            "| allocated what it claimed | largest peak growth | crashes |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    names = {"jpeg": "JPEG frame of up to 65535x65535", "png": "PNG of up to 2^31-1 squared",
             "npy": ".npy shape of up to 2^62 items", "json": "JSON nested 10^6 deep"}
    for kind, name in names.items():
        c = bombs.get(kind)
        if c:
            rows.append(f"| {name} | {c['tried']:,} | {c.get('found', 0):,} "
                        f"| {c.get('wrong_bytes', 0) + c.get('untyped_errors', 0):,} "
                        f"| {c.get('allocated', 0):,} | {c.get('max_growth_mb', 0):,} MiB "
                        f"| {c.get('crashes', 0):,} |")
    return text + "\n" + "\n".join(rows) + (
        "\n\nA header bomb is a few hundred bytes whose header claims a huge size, the fourth "
        "of six samples; every decode path reads the dataset in a fresh child limited to "
        f"{BOMB_LIMIT_AS >> 30} GiB of address space: {', '.join(results['bomb_readers'])} "
        "(images) or fields and workers (.npy, JSON).\n")


def guarantees_block() -> str:
    """The README block rendered from ``benchmarks/results/corruption.json``."""
    return render_guarantees(json.loads(RESULT.read_text()))


def main(argv: list[str] | None = None) -> None:
    """Run the stress and write its results file (or, with ``--child``, be a child)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flips", type=int, default=1500, help="bit flips per backend x codec")
    p.add_argument("--truncations", type=int, default=100, help="truncations per backend x codec")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-torch", dest="torch", action="store_false",
                   help="skip IndexedDataset (no torch import in the children)")
    p.add_argument("--case-timeout", type=float, default=30.0, help="seconds without progress "
                   "after which a child counts as hung")
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--bomb-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(args.child)
        return
    if args.bomb_child:
        bomb_child_main(args.bomb_child)
        return
    # the command that reproduces the figures: every option but where they are written
    given = [f"--flips {args.flips}", f"--truncations {args.truncations}", f"--seed {args.seed}",
             "" if args.torch else "--no-torch", f"--case-timeout {args.case_timeout:g}"]
    command = " ".join(["python -m benchmarks.stress_corruption", *filter(None, given)])
    results = run(flips=args.flips, truncations=args.truncations, seed=args.seed,
                  torch=args.torch, case_timeout_s=args.case_timeout, command=command)
    from benchmarks.resultsfile import write_results

    write_results(args.out, results, command=command)
    print(render_guarantees(results))


if __name__ == "__main__":
    main()
