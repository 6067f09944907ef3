"""MosaicML Streaming (MDS) datasets as a source to pack: ``index.json`` and its shards.

An MDS folder holds ``index.json`` (format version 2: one entry per shard with its
columns, sample count, and the file names and sizes of its raw and, when compressed,
its compressed data) and the shard files. A raw shard is ``uint32 count``, ``count + 1``
``uint32`` offsets of the samples from the start of the file, the shard's columns as
JSON, then the samples: per sample, the ``uint32`` sizes of its variable-size columns,
then each column's bytes in column order (streaming's ``mds/writer.py`` and
``mds/reader.py``). Each shard is read by one task, in parallel. Columns whose MDS
bytes are the value's own bytes (``bytes``, ``jpeg``, ``png``, ``str``, ``json`` and the
``str_*`` texts) are located in place in a raw shard (``shardio.packing.sources.inputbytes``), never
copied; typed numbers (``int``, ``uint8`` … ``float64``) are stored as their text, as a
table's values are. A compressed shard (zstd, gzip, bz2) is decompressed once into a
file in ``spill_dir`` and located there. An index that disagrees with its shards (a
size, a sample count, the columns) is refused by name: nothing is packed from a lie.
A sample whose column sizes overrun it is bad input, named ``shard#index``.
Imports ``errors``, ``inputbytes``, ``source``, ``stems`` and ``walk`` from shardio.
"""

from __future__ import annotations

import bz2
import concurrent.futures as cf
import gzip
import hashlib
import io
import itertools
import json
import mmap
import multiprocessing
import os
import struct
from collections.abc import Callable
from typing import IO, Any, Final, cast

from shardio.errors import BadInputError
from shardio.packing.sources.files import PackSource
from shardio.packing.sources.inputbytes import locator
from shardio.packing.stems import RESERVED_FIELDS, SourceSample
from shardio.packing.walk import Bad

INDEX: Final = "index.json"
KEPT: Final = frozenset({"bytes", "jpeg", "png", "str", "json", "str_int", "str_float",
                         "str_decimal"})
"""Encodings whose stored bytes are the value's own: located as they are."""
NUMBERS: Final = {"int": "<q", "int8": "<b", "int16": "<h", "int32": "<i", "int64": "<q",
                  "uint8": "<B", "uint16": "<H", "uint32": "<I", "uint64": "<Q",
                  "float16": "<e", "float32": "<f", "float64": "<d"}
"""Fixed-size encodings (numpy's little-endian scalars): stored as their text."""


def _open_zstd(fh: IO[bytes]) -> io.RawIOBase:
    import zstandard

    return cast(io.RawIOBase, zstandard.ZstdDecompressor().stream_reader(fh))


DECOMPRESS: Final[dict[str, Callable[[IO[bytes]], io.IOBase]]] = {
    "zstd": _open_zstd,
    "gz": lambda fh: gzip.GzipFile(fileobj=fh, mode="rb"),
    "bz2": lambda fh: bz2.BZ2File(fh, mode="rb"),
}
"""Streaming's compressions that read without another library (not ``br``, ``snappy``)."""


def mds_index(src: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``index.json`` of the MDS dataset folder ``src``, or ``None`` when ``src`` is not
    one (no ``index.json``, or one that is not an MDS index: a folder of files may hold one).

    Raises:
        BadInputError: an MDS index of a version other than 2.
    """
    path = os.path.join(os.fspath(src), INDEX)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            index = json.load(fh)
    except (OSError, ValueError):
        return None
    shards = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(shards, list) or not shards or not all(
            isinstance(s, dict) and s.get("format") == "mds" for s in shards):
        return None
    if index.get("version") != 2 or any(s.get("version") != 2 for s in shards):
        raise BadInputError(f"{path}: MDS index version {index.get('version')!r}; shardio "
                            "reads version 2 (mosaicml-streaming 0.4 and later): write the "
                            "dataset again with a current MDSWriter", path=path)
    return dict(index)


def scan_mds(
    folder: str | os.PathLike[str], index: dict[str, Any], *, spill_dir: str,
    num_workers: int = 1, key_column: str | None = None, label_field: str | None = None,
) -> PackSource:
    """The samples of the MDS dataset in ``folder`` (``index`` its ``mds_index``), in order.

    Args:
        folder: the dataset folder.
        index: its parsed ``index.json``.
        spill_dir: a folder for decompressed shards and values, kept until the pack ends.
        num_workers: shards read at once, in forked processes.
        key_column: a column whose values are the keys (default: the sample's position).
        label_field: an integer column whose values become ``label``.

    Raises:
        BadInputError: the index disagrees with a shard, names a file outside ``folder``
            or a missing one, uses a compression or an encoding shardio cannot read, or
            names a ``key_column``/``label_field`` that is not a column.
    """
    root = os.path.abspath(folder)
    shards: list[dict[str, Any]] = index["shards"]
    columns = _columns(root, shards[0])
    for shard in shards:
        if _columns(root, shard) != columns:
            raise BadInputError(f"{root}/{INDEX}: its shards have different columns; pack "
                                "datasets of one schema", path=os.path.join(root, INDEX))
    names = [c[0] for c in columns]
    for option, value in (("key_column", key_column), ("label_field", label_field)):
        if value is not None and value not in names:
            raise BadInputError(f"{root}: no column {value!r} for {option}; the columns are "
                                f"{names}", path=root)
    if label_field is not None and dict(columns)[label_field] not in NUMBERS:
        raise BadInputError(f"{root}: label column {label_field!r} is "
                            f"{dict(columns)[label_field]!r}; a label is an integer column",
                            path=root)
    starts = [0]
    for shard in shards:
        starts.append(starts[-1] + int(shard["samples"]))
    tasks = [(root, shard, n, os.path.join(spill_dir, f"mds-{n:06d}.bin"), starts[n],
              key_column, label_field) for n, shard in enumerate(shards)]
    if num_workers > 1 and len(tasks) > 1 and "fork" in multiprocessing.get_all_start_methods():
        with cf.ProcessPoolExecutor(min(num_workers, len(tasks)),
                                    multiprocessing.get_context("fork")) as pool:
            scans = list(pool.map(_scan_task, tasks))
    else:
        scans = [_scan_task(t) for t in tasks]
    digest = hashlib.sha256(f"mds\n{key_column}\n{label_field}\n".encode())
    with open(os.path.join(root, INDEX), "rb") as fh:
        digest.update(fh.read())
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    for shard, (found, shard_bad) in zip(shards, scans, strict=True):
        name = _data_name(shard)
        st = os.stat(os.path.join(root, name))
        digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "replace"))
        samples += found
        bad += shard_bad
    keys = [s.key for s in samples]
    if len(set(keys)) != len(keys):
        raise BadInputError(f"{root}: the key column {key_column!r} repeats values; keys must "
                            "be unique (leave --key-column out to key samples by position)",
                            path=root)
    return PackSource(root=root, samples=tuple(samples), classes=None, hidden_ignored=0,
                  bad=tuple(sorted(bad)), digest=digest.hexdigest(), origin="mds")


def _columns(root: str, shard: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``(name, encoding)`` columns of an index entry, each one shardio can read."""
    pairs = list(zip(shard.get("column_names", []), shard.get("column_encodings", []),
                     strict=False))
    for name, encoding in pairs:
        if encoding not in KEPT and encoding not in NUMBERS:
            raise BadInputError(
                f"{root}: column {name!r} has MDS encoding {encoding!r}; shardio packs the "
                f"encodings {sorted(KEPT | NUMBERS.keys())} (rewrite the column as 'bytes' "
                "or 'jpeg': an image's encoded bytes, an array's .npy bytes)", path=root)
        if name in RESERVED_FIELDS or not name:
            raise BadInputError(f"{root}: column name {name!r} is reserved for shardio; "
                                "rename the column", path=root)
    return pairs


def _data_name(shard: dict[str, Any]) -> str:
    """The file holding a shard's data as written: the compressed one, else the raw one."""
    info = shard.get("zip_data") if shard.get("compression") else shard.get("raw_data")
    return str((info or {}).get("basename", ""))


ShardScan = tuple[list[SourceSample], list[Bad]]


def _scan_task(task: tuple[str, dict[str, Any], int, str, int, str | None, str | None]
               ) -> ShardScan:
    root, shard, number, spill, first, key_column, label_field = task
    index_path = os.path.join(root, INDEX)
    name = _data_name(shard)
    path = _inside(root, name, number)

    def lie(what: str) -> BadInputError:
        return BadInputError(
            f"{index_path}: shard {number} ({name}): {what}. The index does not describe "
            "its shards (a shard was replaced or cut short, or the index edited); write the "
            "dataset again, or restore the shard", path=index_path)

    raw_bytes = int(shard["raw_data"]["bytes"])
    compression = str(shard.get("compression") or "")
    listed = int(shard["zip_data"]["bytes"]) if compression else raw_bytes
    size = os.path.getsize(path)
    if raw_bytes <= 0:
        raise lie(f"the index says {raw_bytes} bytes")
    if size != listed:
        raise lie(f"the index says {listed:,} bytes, the file holds {size:,}")
    container = path
    if compression:
        algorithm = compression.partition(":")[0]
        if algorithm not in DECOMPRESS:
            raise BadInputError(f"{path}: compressed with {compression!r}; shardio reads MDS "
                                f"shards compressed with {sorted(DECOMPRESS)} or none",
                                path=path)
        with open(path, "rb") as raw, DECOMPRESS[algorithm](raw) as stream, \
                open(spill, "wb") as out:
            try:
                while chunk := stream.read(1 << 20):
                    out.write(chunk)
            except (OSError, EOFError, ValueError) as exc:  # zstandard.ZstdError is a ValueError
                raise lie(f"it does not decompress as {algorithm} ({exc})") from exc
            written = out.tell()
        if written != raw_bytes:
            raise lie(f"the index says {raw_bytes:,} bytes decompressed, it decompresses to "
                      f"{written:,}")
        container = spill
    return _samples(container, shard, number, name, first, spill, key_column, label_field, lie)


def _inside(root: str, name: str, number: int) -> str:
    """The shard file ``name`` of ``root``; a name leaving it, or a missing file, is refused."""
    if not name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise BadInputError(f"{root}/{INDEX}: shard {number} is named {name!r}, outside the "
                            "dataset folder; such a name is never read", path=root)
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        raise BadInputError(f"{path}: shard {number} named by {INDEX} is missing; copy the "
                            "whole dataset folder", path=path)
    return path


def _samples(container: str, shard: dict[str, Any], number: int, name: str, first: int,
             spill: str, key_column: str | None, label_field: str | None,
             lie: Callable[[str], BadInputError]) -> ShardScan:
    """The samples of the raw shard ``container``, checked against its index entry."""
    names, encodings = list(shard["column_names"]), list(shard["column_encodings"])
    fixed = [None if e in KEPT else struct.calcsize(NUMBERS[e]) for e in encodings]
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    with open(container, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm, \
            open(spill, "ab") as values:
        count = int(shard["samples"])
        if len(mm) < 4 or struct.unpack_from("<I", mm)[0] != count:
            found = struct.unpack_from("<I", mm)[0] if len(mm) >= 4 else "no"
            raise lie(f"the index says {count:,} samples, the shard holds {found}")
        head = 4 + 4 * (count + 1)
        if len(mm) < head:
            raise lie("the shard is shorter than its own sample offsets")
        offsets = struct.unpack_from(f"<{count + 1}I", mm, 4)
        if (offsets[0] < head or offsets[-1] != len(mm)
                or any(a > b for a, b in itertools.pairwise(offsets))):
            raise lie("its sample offsets do not fit the file")
        try:
            config = json.loads(bytes(mm[head:offsets[0]]))
        except ValueError as exc:
            raise lie(f"its columns are not readable JSON ({exc})") from exc
        if (config.get("column_names"), config.get("column_encodings")) != (names, encodings):
            raise lie(f"the index lists columns {names} {encodings}, the shard "
                      f"{config.get('column_names')} {config.get('column_encodings')}")
        for i in range(count):
            start, stop = offsets[i], offsets[i + 1]
            at = f"{name}#{i}"
            where = start + 4 * sum(s is None for s in fixed)
            spans = []
            ok = where <= stop
            var = iter(struct.unpack_from(f"<{sum(s is None for s in fixed)}I", mm, start)
                       if ok else ())
            for size in fixed:
                length = next(var) if size is None else size
                spans.append((where, length))
                where += length
            if not ok or where != stop:
                bad.append((at, "its column sizes do not add up to the sample's length: the "
                                "shard is damaged; write the dataset again"))
                continue
            key, label, fields, locs, sizes = f"{first + i:09d}", None, [], [], []
            for column, encoding, (offset, length) in zip(names, encodings, spans, strict=True):
                if encoding in KEPT and column != key_column:
                    loc = locator(container, offset, length, f"{at}/{column}")
                else:
                    value = struct.unpack_from(NUMBERS[encoding], mm, offset)[0] \
                        if encoding in NUMBERS else bytes(mm[offset:offset + length])
                    if column == label_field:
                        label = int(value)
                        continue
                    text = value.decode("utf-8", "surrogateescape") if isinstance(
                        value, bytes) else json.dumps(value)
                    if column == key_column:
                        key = text
                        continue
                    data = text.encode("utf-8", "surrogateescape")
                    loc = locator(spill, values.tell(), len(data), f"{at}/{column}")
                    values.write(data)
                    length = len(data)
                fields.append(column)
                locs.append(loc)
                sizes.append(length)
            samples.append(SourceSample(key, tuple(fields), tuple(locs), tuple(sizes), label,
                                        sum(sizes)))
    return samples, bad
