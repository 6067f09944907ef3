"""Parquet files and ``datasets.save_to_disk`` folders as a source to pack.

Columns become fields: binary columns keep their bytes, a Hugging Face
``Image`` column (a struct of ``bytes`` and ``path``) its encoded bytes
(never decoded), strings their UTF-8 and any other value its JSON text (as
``shardio.unpack.field_bytes`` writes them back). The first ``ClassLabel``
column (from the Hugging Face features kept in the Parquet schema metadata
or the folder's ``dataset_info.json``) becomes ``label``, its names the
``classes``. A row's key is its ``key_column`` value or its position.

Table cells cannot be read in place one by one (pages are encoded and
compressed), so the scan streams the table once, batch by batch, and spills
each cell's bytes into one file in ``spill_dir``; samples locate their fields
there (``shardio.inputbytes``), and the rest of the pack is a tar's. Memory is
one batch; disk is the table's bytes once more. Imports ``errors``,
``inputbytes``, ``source``, ``stems`` and ``walk`` from shardio; pyarrow lazily. A
``datasets.Dataset`` object is read the same way, batch by batch (``scan_hf_dataset``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any, Final

from shardio.errors import BadInputError, MissingDependencyError
from shardio.inputbytes import locator
from shardio.source import Source
from shardio.stems import RESERVED_FIELDS, SourceSample
from shardio.walk import Bad

HF_INFO: Final = "dataset_info.json"


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


def _batches(path: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        yield from pq.ParquetFile(path).iter_batches(batch_size=1024)
        return
    with pa.memory_map(path) as source:  # save_to_disk writes Arrow IPC streams
        yield from pa.ipc.open_stream(source)


def _schema(path: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        return pq.read_schema(path)
    with pa.memory_map(path) as source:
        return pa.ipc.open_stream(source).schema


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


def scan_tables(files: list[str], *, spill_dir: str, key_column: str | None = None) -> Source:
    """The rows of ``files`` as samples, their cells spilled into ``spill_dir``.

    Raises:
        MissingDependencyError: pyarrow is not installed.
        BadInputError: a file is not a table, or its columns differ from the first file's.
    """
    pa = _pyarrow()
    root = os.path.dirname(os.path.abspath(files[0]))
    names = [os.path.relpath(os.path.abspath(f), root).replace(os.sep, "/") for f in files]
    try:
        schema = _schema(files[0])
    except (pa.ArrowException, OSError) as exc:
        raise BadInputError(f"{files[0]}: not a Parquet or Arrow table ({exc})",
                            path=files[0]) from exc
    digest = hashlib.sha256(f"table\n{key_column}\n".encode())

    def parts() -> Iterator[tuple[str, str, Iterator[Any]]]:
        for path, name in zip(files, names, strict=True):
            st = os.stat(path)
            digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "replace"))
            try:
                names_here = _schema(path).names
            except (pa.ArrowException, OSError) as exc:
                raise BadInputError(f"{path}: not a Parquet or Arrow table ({exc})",
                                    path=path) from exc
            if names_here != schema.names:
                raise BadInputError(
                    f"{path}: its columns {names_here} differ from those of "
                    f"{names[0]} ({schema.names}); pack tables of one schema", path=path)
            yield path, name, _batches(path)

    samples, bad, classes = spill_rows(parts(), schema.names, _features(files, schema),
                                       spill=os.path.join(spill_dir, "cells.bin"),
                                       key_column=key_column, where=files[0])
    _refuse_repeated_keys(samples, root, key_column)
    return Source(root=root, samples=tuple(samples), classes=classes, hidden_ignored=0,
                  bad=tuple(sorted(bad)), digest=digest.hexdigest(), origin="table")


def is_hf_dataset(obj: object) -> bool:
    """Whether ``obj`` is a ``datasets.Dataset`` (duck-typed: datasets is never imported)."""
    return all(hasattr(obj, a) for a in ("features", "with_format", "column_names", "data"))


def scan_hf_dataset(dataset: Any, *, spill_dir: str, key_column: str | None = None) -> Source:
    """The rows of a ``datasets.Dataset`` (in its order, selections and shuffles included)
    as samples, read as Arrow batches (images never decoded) like a ``save_to_disk`` folder.

    An object has no file to stamp, so the digest a resume checks covers every cell's bytes.

    Raises:
        BadInputError: a column name is reserved, or ``key_column`` is missing or repeats.
    """
    pa = _pyarrow()
    name = type(dataset).__name__
    digest = hashlib.sha256(f"hf-dataset\n{key_column}\n".encode())
    batches = dataset.with_format("arrow").iter(batch_size=1024)
    try:
        samples, bad, classes = spill_rows(
            iter([(name, name, batches)]), list(dataset.column_names),
            dataset.features.to_dict(), spill=os.path.join(spill_dir, "cells.bin"),
            key_column=key_column, where=name, content=digest)
    except pa.ArrowException as exc:  # pragma: no cover - an in-memory table reads
        raise BadInputError(f"{name}: its rows cannot be read ({exc})", path=name) from exc
    _refuse_repeated_keys(samples, name, key_column)
    return Source(root=name, samples=tuple(samples), classes=classes, hidden_ignored=0,
                  bad=tuple(sorted(bad)), digest=digest.hexdigest(), origin="table")


def _refuse_repeated_keys(samples: list[SourceSample], root: str, key_column: str | None) -> None:
    keys = [s.key for s in samples]
    if len(set(keys)) != len(keys):
        raise BadInputError(f"{root}: the key column {key_column!r} repeats values; keys must "
                            "be unique (leave --key-column out to key rows by position)",
                            path=root)


def spill_rows(
    parts: Iterator[tuple[str, str, Iterator[Any]]], columns: list[str],
    features: dict[str, Any], *, spill: str, key_column: str | None, where: str,
    content: Any = None,
) -> tuple[list[SourceSample], list[Bad], tuple[str, ...] | None]:
    """Spill the cells of every Arrow batch of ``parts`` (``(path, name, batches)``) into the
    file ``spill`` and return the samples locating them, the bad rows and the classes.

    ``content``: a hash updated with every key and cell, for sources without file stamps.
    """
    pa = _pyarrow()
    label = next((c for c in columns if (features.get(c) or {}).get("_type")
                  == "ClassLabel"), None)
    classes = tuple(features[label]["names"]) if label is not None else None
    if key_column is not None and key_column not in columns:
        raise BadInputError(f"{where}: no column {key_column!r} for the key; its columns "
                            f"are {columns}", path=where)
    fields = [c for c in columns if c not in (label, key_column)]
    bad_names = [c for c in fields if c in RESERVED_FIELDS or not c]
    if bad_names:
        raise BadInputError(f"{where}: column name {bad_names[0]!r} is reserved for shardio; "
                            "rename the column", path=where)
    samples: list[SourceSample] = []
    bad: list[Bad] = []
    position = 0
    with open(spill, "wb") as out:
        for path, name, batches in parts:
            try:
                for batch in batches:
                    for row in batch.to_pylist():
                        at = f"{name}#row{position}"
                        key = str(row[key_column]) if key_column else f"{position:09d}"
                        position += 1
                        missing = [c for c in fields if row[c] is None] + (
                            [label] if label is not None and row[label] is None else [])
                        if missing:
                            bad.append((at, f"column {missing[0]!r} is null; every field "
                                        "of a sample needs a value"))
                            continue
                        locs, sizes = [], []
                        for column in fields:
                            value = row[column]
                            if isinstance(value, dict) and "bytes" in value:  # an HF Image
                                value = value["bytes"]
                            data = _cell_bytes(value)
                            locs.append(locator(spill, out.tell(), len(data), f"{at}/{column}"))
                            sizes.append(len(data))
                            out.write(data)
                            if content is not None:
                                content.update(b"%d\0" % len(data))
                                content.update(data)
                        value = None if label is None else int(row[label])
                        if content is not None:
                            content.update(f"{key}\0{value}\n".encode("utf-8", "replace"))
                        samples.append(SourceSample(key, tuple(fields), tuple(locs),
                                                    tuple(sizes), value, sum(sizes)))
            except (pa.ArrowException, OSError) as exc:
                raise BadInputError(f"{path}: the table cannot be read ({exc}); download or "
                                    "write it again", path=path) from exc
    return samples, bad, classes
