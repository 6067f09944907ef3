"""Parquet files and ``datasets.save_to_disk`` folders as a source to pack.

Columns become fields: binary columns keep their bytes, a Hugging Face
``Image`` column (a struct of ``bytes`` and ``path``) its encoded bytes
(never decoded), strings their UTF-8 and any other value its JSON text (as
``shardio.ops.unpack.field_bytes`` writes them back). The first ``ClassLabel``
column (from the Hugging Face features kept in the Parquet schema metadata
or the folder's ``dataset_info.json``) becomes ``label``, its names the
``classes``. A row's key is its ``key_column`` value or its position.

Table cells cannot be read in place one by one (pages are encoded and
compressed), so the scan streams the table once, batch by batch, and spills
each cell's bytes into one file in ``spill_dir``; samples locate their fields
there (``shardio.packing.sources.inputbytes``), and the rest of the pack is a tar's. Memory is
one batch; disk is the table's bytes once more. Imports ``errors``,
``inputbytes``, ``source``, ``stems`` and ``walk`` from shardio; pyarrow lazily. A
``datasets.Dataset`` object is read the same way, batch by batch (``scan_hf_dataset``).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
from collections.abc import Iterator
from typing import Any, BinaryIO, Final

import numpy as np

from shardio.errors import BadInputError, MissingDependencyError
from shardio.packing.sources.files import PackSource
from shardio.packing.sources.inputbytes import locator
from shardio.packing.stems import RESERVED_FIELDS, SourceSample
from shardio.packing.walk import Bad

HF_INFO: Final = "dataset_info.json"
TASK_ROWS: Final = 8192
"""Rows a spill task reads at least (consecutive row groups of one file), so that files of
small row groups do not become thousands of tasks."""
TASK_BYTES: Final = 64 << 20
"""Or bytes (uncompressed, as the file's metadata says)."""
BATCH_BYTES: Final = 8 << 20
"""About the bytes of one record batch a task holds, besides the page it is decoded from."""

Part = tuple["tuple[int, ...] | None", int]
"""``(row groups, or None for a whole Arrow stream; their rows)``: one spill task's rows."""
SpillTask = tuple[str, str, "tuple[int, ...] | None", int, str, "tuple[str, ...]", "str | None",
                  "str | None"]
"""``(path, name, row groups, first row's position, spill file, fields, label, key column)``."""
Row = tuple[str, "tuple[str, ...]", "tuple[int, ...]", "int | None"]
"""``(key, locators, sizes, label)`` of one good row."""


def table_files(src: str | os.PathLike[str]) -> list[str] | None:
    """The Parquet or Arrow files ``src`` names (a ``.parquet`` file, a folder of them, or a
    ``save_to_disk`` folder), in order; ``None`` when it names no table."""
    text = os.fspath(src)
    if os.path.isfile(text):
        return [text] if text.endswith(".parquet") else None
    if not os.path.isdir(text):
        return None
    names = sorted(n for n in os.listdir(text) if not n.startswith("."))
    if "dataset_dict.json" in names:
        raise BadInputError(f"{text}: a DatasetDict (several splits); pack one split's folder, "
                            f"such as {os.path.join(text, 'train')}", path=text)
    if HF_INFO in names:
        return [os.path.join(text, n) for n in names if n.endswith(".arrow")]
    if names and all(n.endswith(".parquet") for n in names):
        return [os.path.join(text, n) for n in names]
    return None


def _features(files: list[str], schema: Any) -> dict[str, Any]:
    """The Hugging Face features: from ``dataset_info.json`` or the Parquet schema metadata."""
    info = os.path.join(os.path.dirname(files[0]), HF_INFO)
    if os.path.isfile(info):
        with open(info, encoding="utf-8") as fh:
            return dict(json.load(fh).get("features") or {})
    meta = (schema.metadata or {}).get(b"huggingface")
    return dict(json.loads(meta).get("info", {}).get("features") or {}) if meta else {}


def _layout(path: str) -> tuple[Any, list[Part]]:
    """The schema of the table at ``path`` (with its metadata) and its parts: runs of
    consecutive row groups of ``TASK_ROWS`` rows or ``TASK_BYTES`` bytes and their rows (an
    Arrow stream, which has no index of its batches, is one part)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        meta = pq.read_metadata(path)
        parts: list[Part] = []
        run: list[int] = []
        rows = size = 0
        for number in range(meta.num_row_groups):
            group = meta.row_group(number)
            run.append(number)
            rows, size = rows + group.num_rows, size + group.total_byte_size
            if rows >= TASK_ROWS or size >= TASK_BYTES:
                parts.append((tuple(run), rows))
                run, rows, size = [], 0, 0
        if run:
            parts.append((tuple(run), rows))
        return pq.read_schema(path), parts
    with pa.memory_map(path) as source:  # save_to_disk writes Arrow IPC streams
        reader = pa.ipc.open_stream(source)
        return reader.schema, [(None, sum(batch.num_rows for batch in reader))]


def _batches(path: str, groups: tuple[int, ...] | None) -> Iterator[Any]:
    """The record batches of row groups ``groups`` of ``path`` (all of an Arrow stream), each
    about ``BATCH_BYTES``. A Parquet file is mapped (half the CPU of reading it: pages are
    decompressed from the map) and decoded a page at a time, not a column chunk at once; a
    page is as big as its writer made it (a dictionary page can hold a whole row group's
    values), which is what a task holds besides its batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if groups is None:
        with pa.memory_map(path) as source:
            yield from pa.ipc.open_stream(source)
        return
    with pq.ParquetFile(path, memory_map=True, pre_buffer=False,
                        buffer_size=1 << 20) as table:
        meta = [table.metadata.row_group(g) for g in groups]
        rows, size = sum(g.num_rows for g in meta), sum(g.total_byte_size for g in meta)
        yield from table.iter_batches(batch_size=max(1, min(1024, BATCH_BYTES * rows // max(
            size, 1))), row_groups=list(groups), use_threads=False)


def _cell_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise MissingDependencyError(f"packing Parquet or Arrow needs pyarrow ({exc}); "
                                     "pip install pyarrow") from exc
    return pa




def _plan(columns: list[str], features: dict[str, Any], key_column: str | None,
          where: str) -> tuple[tuple[str, ...], str | None, tuple[str, ...] | None]:
    """The fields, the ``ClassLabel`` column (the first) and its names, of a table.

    Raises:
        BadInputError: ``key_column`` is no column, or a column name is reserved.
    """
    label = next((c for c in columns if (features.get(c) or {}).get("_type")
                  == "ClassLabel"), None)
    classes = tuple(features[label]["names"]) if label is not None else None
    if key_column is not None and key_column not in columns:
        raise BadInputError(f"{where}: no column {key_column!r} for the key; its columns "
                            f"are {columns}", path=where)
    fields = tuple(c for c in columns if c not in (label, key_column))
    bad_names = [c for c in fields if c in RESERVED_FIELDS or not c]
    if bad_names:
        raise BadInputError(f"{where}: column name {bad_names[0]!r} is reserved for shardio; "
                            "rename the column", path=where)
    return fields, label, classes


def scan_tables(files: list[str], *, spill_dir: str, key_column: str | None = None,
                num_workers: int | None = None) -> PackSource:
    """The rows of ``files`` as samples, their cells spilled into ``spill_dir``.

    Runs of row groups are spilled by parallel tasks in forked processes, each into a
    file of its own (``num_workers`` at once, default every core); keys and bytes depend
    on the rows only, so the output is the same for any worker count.

    Raises:
        MissingDependencyError: pyarrow is not installed.
        BadInputError: a file is not a table, its columns differ from the first file's, or
            its rows cannot be read.
    """
    pa = _pyarrow()
    root = os.path.dirname(os.path.abspath(files[0]))
    names = [os.path.relpath(os.path.abspath(f), root).replace(os.sep, "/") for f in files]
    digest = hashlib.sha256(f"table\n{key_column}\n".encode())
    tasks: list[SpillTask] = []
    first = 0
    schema = plan = None
    for path, name in zip(files, names, strict=True):
        st = os.stat(path)
        digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "replace"))
        try:
            here, parts = _layout(path)
        except (pa.ArrowException, OSError) as exc:
            raise BadInputError(f"{path}: not a Parquet or Arrow table ({exc})",
                                path=path) from exc
        if schema is None:
            schema = here
            plan = _plan(schema.names, _features(files, schema), key_column, files[0])
        elif here.names != schema.names:
            raise BadInputError(
                f"{path}: its columns {here.names} differ from those of "
                f"{names[0]} ({schema.names}); pack tables of one schema", path=path)
        assert plan is not None
        for groups, count in parts:
            tasks.append((path, name, groups, first,
                          os.path.join(spill_dir, f"cells-{len(tasks):06d}.bin"), plan[0],
                          plan[1], key_column))
            first += count
    assert plan is not None
    workers = min(len(tasks), num_workers or len(os.sched_getaffinity(0)))
    if workers > 1:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with cf.ProcessPoolExecutor(workers, multiprocessing.get_context(method)) as pool:
            spilled = list(pool.map(_spill_task, tasks))
    else:
        spilled = [_spill_task(t) for t in tasks]
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    for task, (rows, task_bad, error) in zip(tasks, spilled, strict=True):
        if error is not None:
            raise BadInputError(f"{task[0]}: the table cannot be read ({error}); download or "
                                "write it again", path=task[0])
        samples += _samples(plan[0], rows)
        bad += task_bad
    _refuse_repeated_keys(samples, root, key_column)
    return PackSource(root=root, samples=tuple(samples), classes=plan[2], hidden_ignored=0,
                  bad=tuple(sorted(bad)), digest=digest.hexdigest(), origin="table")


def _samples(fields: tuple[str, ...], rows: list[Row]) -> list[SourceSample]:
    return [SourceSample(key, fields, locs, sizes, label, sum(sizes))
            for key, locs, sizes, label in rows]


def _spill_task(task: SpillTask) -> tuple[list[Row], list[Bad], str | None]:
    """Spill one run of row groups into its file: its rows, its bad rows and, when it
    cannot be read, why (returned, not raised: it crosses a process boundary)."""
    path, name, groups, first, spill, fields, label, key_column = task
    pa = _pyarrow()
    try:
        with open(spill, "wb") as out:
            rows, bad = spill_batches(_batches(path, groups), out, spill, name, first, fields,
                                      label, key_column)
    except (pa.ArrowException, OSError) as exc:
        return [], [], str(exc)
    return rows, bad, None


def is_hf_dataset(obj: object) -> bool:
    """Whether ``obj`` is a ``datasets.Dataset`` (duck-typed: datasets is never imported)."""
    return all(hasattr(obj, a) for a in ("features", "with_format", "column_names", "data"))


def scan_hf_dataset(dataset: Any, *, spill_dir: str, key_column: str | None = None) -> PackSource:
    """The rows of a ``datasets.Dataset`` (in its order, selections and shuffles included)
    as samples, read as Arrow batches (images never decoded) like a ``save_to_disk`` folder.

    An object has no file to stamp, so the digest a resume checks covers every cell's bytes.

    Raises:
        BadInputError: a column name is reserved, or ``key_column`` is missing or repeats.
    """
    pa = _pyarrow()
    name = type(dataset).__name__
    digest = hashlib.sha256(f"hf-dataset\n{key_column}\n".encode())
    fields, label, classes = _plan(list(dataset.column_names), dataset.features.to_dict(),
                                   key_column, name)
    spill = os.path.join(spill_dir, "cells.bin")
    batches = (batch for table in dataset.with_format("arrow").iter(batch_size=1024)
               for batch in table.to_batches())
    try:
        with open(spill, "wb") as out:
            rows, bad = spill_batches(batches, out, spill, name, 0, fields, label, key_column,
                                      content=digest)
    except pa.ArrowException as exc:  # pragma: no cover - an in-memory table reads
        raise BadInputError(f"{name}: its rows cannot be read ({exc})", path=name) from exc
    samples = _samples(fields, rows)
    _refuse_repeated_keys(samples, name, key_column)
    return PackSource(root=name, samples=tuple(samples), classes=classes, hidden_ignored=0,
                  bad=tuple(sorted(bad)), digest=digest.hexdigest(), origin="table")


def _refuse_repeated_keys(samples: list[SourceSample], root: str, key_column: str | None) -> None:
    keys = [s.key for s in samples]
    if len(set(keys)) != len(keys):
        raise BadInputError(f"{root}: the key column {key_column!r} repeats values; keys must "
                            "be unique (leave --key-column out to key rows by position)",
                            path=root)


def _is_bytes_like(kind: Any) -> bool:
    pa = _pyarrow()
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_string(kind) or pa.types.is_large_string(kind))


Cells = tuple[list[int], list[int], "list[bool] | None", "list[Any] | None"]
"""A column's cells as spilled: their offsets in the spill, sizes, which are null, and (when
asked) their bytes."""


def _spill_column(array: Any, out: BinaryIO, keep: bool) -> Cells:
    """Write the cells of one column of a batch to ``out``.

    A binary or string column (and an image's ``bytes``) is written as the one run of bytes
    Arrow holds it in, its offsets taken from Arrow's: no Python object per cell.
    """
    kind = array.type
    if kind.num_fields and kind.get_field_index("bytes") >= 0 and _is_bytes_like(
            kind.field("bytes").type):  # a Hugging Face Image: its encoded bytes, never decoded
        array, kind = array.flatten()[kind.get_field_index("bytes")], kind.field("bytes").type
    nulls = array.is_null().to_pylist() if array.null_count else None
    if _is_bytes_like(kind):
        wide = kind in (_pyarrow().large_binary(), _pyarrow().large_string())
        offsets = np.frombuffer(array.buffers()[1], np.int64 if wide else np.int32)[
            array.offset:array.offset + len(array) + 1].astype(np.int64)
        lo, hi = int(offsets[0]), int(offsets[-1])
        data = memoryview(array.buffers()[2] or b"")
        base = out.tell()
        out.write(data[lo:hi])
        starts = (offsets[:-1] + (base - lo)).tolist()
        sizes = np.diff(offsets).tolist()
        return starts, sizes, nulls, [data[s - base + lo:s - base + lo + n]
                                      for s, n in zip(starts, sizes, strict=True)] if keep else None
    starts, sizes, blobs = [], [], []
    for value in array.to_pylist():
        if isinstance(value, dict) and "bytes" in value:  # an image whose bytes are not binary
            value = value["bytes"]
        cell = b"" if value is None else _cell_bytes(value)
        starts.append(out.tell())
        sizes.append(len(cell))
        blobs.append(cell)
        out.write(cell)
    return starts, sizes, nulls, blobs if keep else None


def spill_batches(
    batches: Iterator[Any], out: BinaryIO, spill: str, name: str, position: int,
    fields: tuple[str, ...], label: str | None, key_column: str | None, *,
    content: Any = None,
) -> tuple[list[Row], list[Bad]]:
    """Spill the cells of the record ``batches`` into ``out`` (the file ``spill``) and return
    the rows locating them, and the bad rows; ``position`` is the first row's in the source.

    ``content``: a hash updated with every key and cell, for sources without file stamps.
    """
    rows: list[Row] = []
    bad: list[Bad] = []
    for batch in batches:
        if not batch.num_rows:
            continue
        columns = [_spill_column(batch.column(f), out, content is not None) for f in fields]
        keys = batch.column(key_column).to_pylist() if key_column else None
        labels = batch.column(label).to_pylist() if label is not None else None
        for r in range(batch.num_rows):
            at = f"{name}#row{position}"
            key = str(keys[r]) if keys is not None else f"{position:09d}"
            position += 1
            missing = [f for f, c in zip(fields, columns, strict=True)
                       if c[2] is not None and c[2][r]]
            if labels is not None and labels[r] is None:
                missing.append(str(label))
            if missing:
                bad.append((at, f"column {missing[0]!r} is null; every field of a sample "
                                "needs a value"))
                continue
            sizes = tuple(c[1][r] for c in columns)
            value = None if labels is None else int(labels[r])
            if content is not None:
                for _, cell_sizes, _, blobs in columns:
                    assert blobs is not None
                    content.update(b"%d\0" % cell_sizes[r])
                    content.update(blobs[r])
                content.update(f"{key}\0{value}\n".encode("utf-8", "replace"))
            rows.append((key, tuple(locator(spill, c[0][r], c[1][r], f"{at}/{f}")
                                    for f, c in zip(fields, columns, strict=True)), sizes, value))
    return rows, bad
