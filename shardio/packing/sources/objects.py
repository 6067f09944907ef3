"""Python objects as a source to pack: datasets, map-style datasets and iterables of samples.

``shardio.pack(obj, out)`` takes a ``datasets.Dataset`` (its Arrow rows, read as
``shardio.packing.sources.tables`` reads a ``save_to_disk`` folder), an object that names its
files (``.samples`` or ``.imgs`` pairs of path and label and ``.classes``, as
torchvision's ``ImageFolder``: the files are packed as they are, as
``pack_imagefolder`` packs them), a map-style dataset (``__getitem__`` and
``__len__``, as ``torch.utils.data.Dataset``) whose items are dicts of fields or
``(image, label)`` pairs, or any iterable of sample dicts. Items are turned into
bytes once and spilled into files in ``spill_dir``; samples locate their fields
there (``shardio.packing.sources.inputbytes``), so the rest of the pack is a table's. A map-style
dataset is read in forked processes, each spilling a contiguous range of indices
into a file of its own; keys, bytes and the digest a resume checks depend on the
items only, so the output is the same for any worker count.

A value becomes bytes as it is where it is bytes; a string as UTF-8; an array
(numpy, or anything with ``.numpy()`` such as a tensor) as ``.npy``; a PIL image
as the bytes of the file it was opened from when it is unchanged, else as a
lossless PNG (noted in the summary: never re-encoded silently); other values as
JSON. An item that raises, or cannot be stored, is bad input named by its index.
Imports ``errors``, ``inputbytes``, ``source``, ``stems``, ``tablesource`` and
``walk`` from shardio; never torch (datasets are recognised by what they have).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import json
import multiprocessing
import operator
import os
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any, Final

from shardio.errors import BadInputError
from shardio.packing.sources.files import PackSource, dataset_source
from shardio.packing.sources.inputbytes import locator
from shardio.packing.sources.tables import is_hf_dataset, scan_hf_dataset
from shardio.packing.stems import RESERVED_FIELDS, SourceSample
from shardio.packing.walk import Bad

PNG_NOTE: Final = ("{count} PIL image(s) had no unchanged file to read their bytes from "
                   "and were stored as lossless PNG (field {field!r}, first at index {first})")
_MAX_CHUNK: Final = 1024

_shared: list[Any] = []
"""The dataset forked tasks read (inherited by ``fork``, never pickled)."""

Item = tuple[str, tuple[str, ...], tuple[str, ...], tuple[int, ...], "int | None", str, str]
"""One good item: key, fields, locators, sizes, label, sha256 of it, the field made PNG ('')."""
Chunk = list["Item | Bad"]
"""What one task spilled, per index in order: an item, or a bad one."""


def is_python_source(obj: object) -> bool:
    """Whether ``obj`` is an object to pack rather than a path (str or ``os.PathLike``)."""
    return not isinstance(obj, (str, bytes, os.PathLike))


def scan_objects(obj: Any, *, spill_dir: str, num_workers: int = 1,
                 key_column: str | None = None) -> PackSource:
    """The samples of the Python object ``obj``, their bytes spilled into ``spill_dir``.

    Args:
        obj: a ``datasets.Dataset``, an object naming its files (``.samples``/``.imgs``
            and ``.classes``), a map-style dataset, or an iterable of sample dicts.
        spill_dir: an empty folder for the spilled bytes, kept until the pack ends.
        num_workers: processes reading a map-style dataset at once.
        key_column: with a ``datasets.Dataset``, the column whose values are the keys.

    Raises:
        BadInputError: ``obj`` is none of these, keys repeat, or an iterable raises.
    """
    if is_hf_dataset(obj):
        return scan_hf_dataset(obj, spill_dir=spill_dir, key_column=key_column)
    if key_column is not None:
        raise ValueError("key_column names a column of a table or a datasets.Dataset; a "
                         "dict sample names its key with '__key__'")
    named = _named_files(obj)
    if named is not None:
        return dataset_source(named)
    name = type(obj).__name__
    if hasattr(obj, "__getitem__") and hasattr(obj, "__len__"):
        chunks = _read_indexed(obj, len(obj), spill_dir, num_workers)
    elif hasattr(obj, "__iter__"):
        chunks = [_spill(enumerate(_iterate(obj, name)), os.path.join(spill_dir, "items.bin"),
                         getattr(obj, "classes", None))]
    else:
        raise BadInputError(
            f"{name}: not a source to pack: pass a folder, a datasets.Dataset, a map-style "
            "dataset (__getitem__ and __len__) or an iterable of sample dicts", path=name)
    return _source(name, chunks, getattr(obj, "classes", None))


def _named_files(obj: Any) -> Any:
    """``obj`` as ``dataset_source`` takes it when it names its files (``.samples`` or
    ``.imgs`` of ``(path, label)`` and ``.classes``), else ``None``."""
    pairs = getattr(obj, "samples", None)
    if pairs is None:
        pairs = getattr(obj, "imgs", None)
    classes = getattr(obj, "classes", None)
    if not isinstance(pairs, (list, tuple)) or not pairs or classes is None or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], (str, os.PathLike))
            for p in pairs):
        return None
    class_to_idx = getattr(obj, "class_to_idx", None) or {c: i for i, c in enumerate(classes)}
    return SimpleNamespace(samples=pairs, classes=classes, class_to_idx=class_to_idx,
                           root=getattr(obj, "root", None))


def _iterate(obj: Any, name: str) -> Iterator[Any]:
    """The items of an iterable; an iterator that raises cannot go on, so the pack stops."""
    position = 0
    iterator = iter(obj)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except Exception as exc:
            raise BadInputError(
                f"{name}: iterating it raised {type(exc).__name__} after {position} samples "
                f"({exc}); an iterator cannot resume past an error, so fix it (or drop the "
                "sample in it) and pack again", path=name) from exc
        position += 1
        yield item


def _read_indexed(obj: Any, count: int, spill_dir: str, num_workers: int) -> list[Chunk]:
    """Every index of a map-style dataset, in contiguous ranges: one spill file each."""
    size = max(1, min(_MAX_CHUNK, -(-count // max(1, num_workers * 4))))
    tasks = [(os.path.join(spill_dir, f"items-{n:06d}.bin"), start, min(start + size, count))
             for n, start in enumerate(range(0, count, size))]
    _shared[:] = [obj]
    try:
        if num_workers > 1 and len(tasks) > 1 and "fork" in multiprocessing.get_all_start_methods():
            with cf.ProcessPoolExecutor(min(num_workers, len(tasks)),
                                        multiprocessing.get_context("fork")) as pool:
                return list(pool.map(_spill_range, tasks))
        return [_spill_range(t) for t in tasks]
    finally:
        _shared.clear()


def _spill_range(task: tuple[str, int, int]) -> Chunk:
    path, start, stop = task
    dataset = _shared[0]

    def items() -> Iterator[tuple[int, Any]]:
        for index in range(start, stop):
            try:
                yield index, dataset[index]
            except Exception as exc:  # the dataset's own error: bad input, by index
                yield index, _Raised(f"dataset[{index}] raised {type(exc).__name__}: {exc}")

    return _spill(items(), path, getattr(dataset, "classes", None))


class _Raised:
    """An item that could not be read: why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _spill(items: Iterator[tuple[int, Any]], path: str, classes: Any) -> Chunk:
    """Write the bytes of each item into the file ``path``; return what each became."""
    out: list[Item | Bad] = []
    with open(path, "wb") as fh:
        for index, item in items:
            try:
                key, fields, label, made_png = _fields(item, index, classes)
            except _BadItem as exc:
                out.append((f"[{index}]", str(exc)))
                continue
            digest = hashlib.sha256(f"{key}\0{label}\n".encode("utf-8", "surrogateescape"))
            locs, sizes = [], []
            for field, data in fields:
                locs.append(locator(path, fh.tell(), len(data), f"[{index}]/{field}"))
                sizes.append(len(data))
                fh.write(data)
                digest.update(f"{field}\0{len(data)}\0".encode("utf-8", "surrogateescape"))
                digest.update(data)
            out.append((key, tuple(f for f, _ in fields), tuple(locs), tuple(sizes), label,
                        digest.hexdigest(), made_png))
    return out


class _BadItem(Exception):
    """Why one item cannot be packed (its index is added where it is reported)."""


def _fields(item: Any, index: int, classes: Any) -> tuple[str, list[tuple[str, bytes]],
                                                          int | None, str]:
    """An item's key, fields as bytes, label and the field stored as new PNG ('' if none)."""
    if isinstance(item, _Raised):
        raise _BadItem(item.reason)
    key, label = f"{index:09d}", None
    if isinstance(item, Mapping):
        values = []
        for name, value in item.items():
            if name == "__key__":
                key = str(value)
            elif not isinstance(name, str) or not name or name in RESERVED_FIELDS or (
                    name.startswith("__") and name.endswith("__")):
                continue  # WebDataset's __url__ and friends: metadata, not fields
            elif name == "label" and _as_int(value) is not None:
                label = _as_int(value)
            else:
                values.append((name, value))
        if not values:
            raise _BadItem("a dict without fields (its keys name the fields of a sample)")
    elif isinstance(item, tuple) and len(item) == 2 and _as_int(item[1]) is not None:
        values, label = [(_first_field(item[0]), item[0])], _as_int(item[1])
    else:
        raise _BadItem(f"dataset[{index}] is a {type(item).__name__}; expected a dict of "
                       "fields or an (image, label) pair")
    if label is not None and classes is not None and not 0 <= label < len(classes):
        raise _BadItem(f"label {label} is not an index into the dataset's {len(classes)} classes")
    made_png = ""
    fields = []
    for name, value in sorted(values, key=lambda v: str(v[0])):
        data, png = _value_bytes(value, name)
        made_png = made_png or (name if png else "")
        fields.append((name, data))
    return key, fields, label, made_png


def _as_int(value: Any) -> int | None:
    """An integer label (an int, a numpy integer, a one-element integer tensor), or ``None``."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _first_field(value: Any) -> str:
    """The field name of the first member of an ``(x, label)`` pair, after what it holds."""
    if _is_pil(value) or isinstance(value, (bytes, bytearray, memoryview)):
        return "image"
    if hasattr(value, "__array__") or hasattr(value, "numpy"):
        return "npy"
    return "txt" if isinstance(value, str) else "json"


def _is_pil(value: Any) -> bool:
    return hasattr(value, "save") and hasattr(value, "mode") and hasattr(value, "getbands")


def _value_bytes(value: Any, name: str) -> tuple[bytes, bool]:
    """The bytes stored for ``value``, and whether they are a PNG made here."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), False
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape"), False
    if _is_pil(value):
        return _image_bytes(value, name)
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a tensor (torch not imported)
        value = value.detach().cpu().numpy()
    if hasattr(value, "__array__") and hasattr(value, "dtype") and bool(getattr(value, "ndim", 0)):
        import numpy as np

        out = io.BytesIO()
        try:
            np.save(out, np.asarray(value), allow_pickle=False)
        except ValueError as exc:
            raise _BadItem(f"field {name!r}: an array of objects cannot be stored ({exc})") \
                from exc
        return out.getvalue(), False
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a numpy scalar
        value = value.item()
    if value is None:
        raise _BadItem(f"field {name!r} is None; every field of a sample needs a value")
    try:
        return json.dumps(value, ensure_ascii=False).encode("utf-8"), False
    except (TypeError, ValueError) as exc:
        raise _BadItem(f"field {name!r}: a {type(value).__name__} has no byte form (bytes, "
                       "str, an array, a PIL image or JSON); convert it in the dataset") from exc


def _image_bytes(image: Any, name: str) -> tuple[bytes, bool]:
    """The file a PIL image was opened from, read as it is when the image is unchanged
    (it keeps its ``format``; a converted or new image has none), else a lossless PNG."""
    filename = getattr(image, "filename", "")
    if image.format is not None and isinstance(filename, str) and filename:
        try:
            with open(filename, "rb") as fh:
                return fh.read(), False
        except OSError as exc:
            raise _BadItem(f"field {name!r}: its file {filename} cannot be read "
                           f"({exc.strerror})") from exc
    out = io.BytesIO()
    try:
        image.save(out, format="PNG")
    except (OSError, ValueError, KeyError) as exc:
        raise _BadItem(f"field {name!r}: a {image.mode} image cannot be stored losslessly as "
                       f"PNG ({exc}); convert it, or return its encoded bytes") from exc
    return out.getvalue(), True


def _source(name: str, chunks: list[Chunk], classes: Any) -> PackSource:
    """The samples of every chunk, in index order, as a ``PackSource``."""
    digest = hashlib.sha256(b"python\n")
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    seen: set[str] = set()
    png: list[tuple[int, str]] = []
    labelled = False
    for index, entry in enumerate(e for chunk in chunks for e in chunk):
        if len(entry) == 2:
            bad.append(entry)
            digest.update(f"bad\0{entry[0]}\n".encode())
            continue
        key, fields, locs, sizes, label, item_digest, made_png = entry
        if key in seen:
            raise BadInputError(f"{name}: key {key!r} is given twice ('__key__'); keys must "
                                "be unique (leave '__key__' out to key by position)",
                                path=name)
        seen.add(key)
        labelled = labelled or label is not None
        if made_png:
            png.append((index, made_png))
        digest.update(item_digest.encode())
        samples.append(SourceSample(key, fields, locs, sizes, label, sum(sizes)))
    notes = (PNG_NOTE.format(count=len(png), field=png[0][1], first=png[0][0]),) if png else ()
    return PackSource(root=name, samples=tuple(samples),
                  classes=tuple(str(c) for c in classes) if labelled and classes else None,
                  hidden_ignored=0, bad=tuple(sorted(bad)), digest=digest.hexdigest(),
                  origin="python", notes=notes)
