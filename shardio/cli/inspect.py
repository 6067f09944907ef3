"""``shardio info``, ``ls`` and ``cat``: look inside a dataset without unpacking it.

Each command reads through the public API (``read_manifest``,
``open_dataset``/``DatasetReader``, ``catalog.find_key``/``read_label``,
``unpack.field_bytes``); this module only formats. It also holds the two small
pieces every shardio command shares: ``format_size`` for human byte counts and
``dataset_errors``, which turns a ``ShardioError`` into a one-line message and
exit status 1 (``DATASET``, the dataset argument, lives in ``options`` and is
re-exported here). The reader is imported by the commands that read records,
not here: ``shardio info`` needs the manifest only and starts without numpy.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from shardio.cli.options import DATASET as DATASET  # re-exported: verify, unpack, bench use it
from shardio.cli.options import LocalPath, remote_options
from shardio.errors import ShardioError
from shardio.format.manifest import Manifest
from shardio.storage.location import read_manifest
from shardio.storage.options import RemoteOptions

if TYPE_CHECKING:
    from shardio.reading.reader import DatasetReader

MAX_LISTED: Final = 10
"""Classes and shards beyond this many are abbreviated in ``info``."""



def format_size(num_bytes: float) -> str:
    """``1234567`` → ``"1.2 MB"`` (decimal units, as ``--max-shard-bytes`` parses them)."""
    size = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


@contextmanager
def dataset_errors() -> Iterator[None]:
    """Report a ``ShardioError`` (or an OS error) as ``Error: …`` with exit status 1."""
    try:
        yield
    except ShardioError as exc:
        raise click.ClickException(_own_text(exc)) from exc
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(f"{where}{exc.strerror or exc}") from exc


def _own_text(exc: ShardioError) -> str:
    """``exc``'s message; raised in a DataLoader worker, torch re-raised it with the worker's
    traceback before it, which ``--debug`` shows and one ``Error:`` line does not."""
    text = str(exc)
    if "\nOriginal Traceback" in text:
        last = text.rstrip().rsplit("\n", 1)[-1]
        text = last.split(": ", 1)[1] if last.startswith("shardio.errors.") else last
    return text


def abbreviate(items: Sequence[str], limit: int = MAX_LISTED) -> str:
    """``a, b, c, … (N more), y, z`` when ``items`` is longer than ``limit``."""
    if len(items) <= limit:
        return ", ".join(items)
    head, tail = items[: limit - 2], items[-2:]
    return f"{', '.join(head)}, … ({len(items) - limit} more), {', '.join(tail)}"


def _info_lines(path: Path | str, manifest: Manifest) -> Iterator[str]:
    row = "{:<12} {}".format
    yield row("dataset", path)
    version = manifest.shardio_version
    written = f" (written by shardio {version})" if version else ""
    yield row("format", f"{manifest.format} v{manifest.version}{written}")
    yield row("backend", manifest.backend)
    yield row("codec", manifest.codec)
    yield row("samples", f"{manifest.num_samples:,}")
    size = f"{format_size(manifest.num_bytes)} in {len(manifest.shards)} shard(s)"
    if manifest.input_bytes:
        size += (f"; input {format_size(manifest.input_bytes)}, ratio "
                 f"{manifest.num_bytes / manifest.input_bytes:.3f}")
    yield row("bytes", size)
    yield row("fields", ", ".join(manifest.fields) or "(none)")
    if manifest.classes is not None:
        yield row("classes", f"{len(manifest.classes)}: {abbreviate(manifest.classes)}")
    order = f"shuffled, seed {manifest.seed}" if manifest.shuffle else "stored in input order"
    yield row("order", order)
    if manifest.options:
        options = ", ".join(f"{k}={v}" for k, v in sorted(manifest.options.items()))
        yield row("options", options)
    yield "shards"
    shards = list(manifest.shards)
    shown = shards if len(shards) <= MAX_LISTED else shards[: MAX_LISTED - 2] + shards[-2:]
    yield f"  {'name':<20} {'samples':>9} {'first':>11} {'size':>10}  checksum"
    for i, shard in enumerate(shown):
        if len(shards) > MAX_LISTED and i == MAX_LISTED - 2:
            yield f"  … {len(shards) - MAX_LISTED} more shards"
        yield (f"  {shard.name:<20} {shard.num_samples:>9,} {shard.first_index:>11,} "
               f"{format_size(shard.num_bytes):>10}  {shard.checksum}")
    if manifest.skipped:
        yield row("skipped", f"{len(manifest.skipped)} file(s)")
        for skipped in manifest.skipped[:MAX_LISTED]:
            yield f"  {skipped.path}: {skipped.reason}"
        if len(manifest.skipped) > MAX_LISTED:
            yield f"  … {len(manifest.skipped) - MAX_LISTED} more"


@click.command()
@click.argument("dataset", type=DATASET)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def info(dataset: Path | str, as_json: bool) -> None:
    """Show what the manifest of DATASET says.

    Format, backend, codec, counts, sizes, fields, classes, order, options,
    shards and skipped input files.
    """
    with dataset_errors():
        manifest = read_manifest(dataset)
    if as_json:
        click.echo(json.dumps(manifest.to_json(), indent=1, ensure_ascii=False))
        return
    for line in _info_lines(dataset, manifest):
        click.echo(line)


def _entries(reader: DatasetReader, limit: int | None) -> Iterator[dict[str, Any]]:
    """Key, stored size and (for labelled data) label of each sample, in stored order.

    Sizes come from the shard index (a ``.rec`` shard's record offsets: a remote
    one fetches its tail, not its records) and labels from ``read_label``, which
    neither checks nor decodes the image bytes: listing is not verifying. A remote
    shard whose labels are listed has its ranges read ahead in stored order.
    """
    from shardio.reading.catalog import read_label

    classes = reader.manifest.classes
    by_offsets = reader.manifest.backend == "records"
    index = 0
    for number, shard_info in enumerate(reader.manifest.shards):
        shard = reader.shard(number)
        if classes is not None and reader.is_remote and shard.num_records:
            left = shard.num_records if limit is None else limit - index
            if left > 0:
                shard.will_need(0, min(shard.num_records, left))
        for record, key in enumerate(shard.keys()):
            if limit is not None and index >= limit:
                return
            size = _record_bytes(reader, number, shard, record, by_offsets)
            entry: dict[str, Any] = {"index": index, "key": key, "shard": shard_info.name,
                                     "bytes": size}
            if classes is not None:
                label = read_label(reader, index)
                entry["label"] = label
                entry["class"] = classes[label]
            yield entry
            index += 1
        reader.close_shard(number)


@click.command(name="ls")
@click.argument("dataset", type=DATASET)
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="List at most this many samples.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON array of objects: index, key, shard, bytes (stored), "
                   "and label and class on ImageFolder packs.")
@remote_options
def ls(dataset: Path | str, limit: int | None, as_json: bool, remote: RemoteOptions) -> None:
    """List the samples of DATASET: stored size, label and key.

    Samples are listed in stored (shuffled) order, under a header row; sizes are
    bytes as stored.
    Labels are read without checking the images: `shardio verify` checks that each
    image is complete, `shardio verify --images` decodes each one.
    """
    from shardio.reading.reader import open_dataset

    with dataset_errors(), open_dataset(dataset, remote=remote) as reader:
        if as_json:
            # one document, written as it is produced: a listing of millions stays streamed
            separator = "["
            for entry in _entries(reader, limit):
                click.echo(separator + json.dumps(entry, ensure_ascii=False), nl=False)
                separator = ",\n"
            click.echo("[]" if separator == "[" else "]")
            return
        click.echo(_ls_row({"bytes": "bytes", "label": "label", "class": "class", "key": "key"}
                           if reader.manifest.classes is not None
                           else {"bytes": "bytes", "key": "key"}))
        for entry in _entries(reader, limit):
            click.echo(_ls_row(entry))


def _ls_row(entry: dict[str, Any]) -> str:
    """One line of ``shardio ls``: its header when given the column names."""
    if "label" in entry:
        return f"{entry['bytes']:>10}  {entry['label']:>5} {entry['class']:<16} {entry['key']}"
    return f"{entry['bytes']:>10}  {entry['key']}"


def _default_field(sample: dict[str, Any], *, layout: str) -> str:
    from shardio.format.manifest import CLASS_FOLDERS, IMAGEFOLDER
    from shardio.ops.unpack import IMAGE_FIELD, RESERVED_FIELDS

    fields = [name for name in sample if name not in RESERVED_FIELDS]
    if layout == IMAGEFOLDER and IMAGE_FIELD in fields:
        return IMAGE_FIELD
    if layout == CLASS_FOLDERS:  # the class label is not one of the sample's files
        fields = [name for name in fields if name != "label"]
    if len(fields) == 1:
        return fields[0]
    raise click.ClickException(
        f"sample {sample['__key__']!r} has fields {', '.join(map(repr, fields))}; "
        "name the one to print: shardio cat DATASET KEY FIELD"
    )


@click.command()
@click.argument("dataset", type=DATASET)
@click.argument("key")
@click.argument("field", required=False)
@click.option("-o", "--output", type=LocalPath("output", dir_okay=False), default=None,
              help="Write the bytes to this file instead of stdout.")
@remote_options
def cat(dataset: Path | str, key: str, field: str | None, output: Path | None,
        remote: RemoteOptions) -> None:
    """Print the raw bytes of one field of sample KEY.

    FIELD defaults to "image" on ImageFolder packs and to the only field of
    the sample otherwise. Binary bytes go to a file (-o FILE) or a pipe, never
    to a terminal: shardio cat DATASET KEY > file.
    The key is found from the shards' key blocks; no other record is read.
    """
    from shardio.ops.unpack import RESERVED_FIELDS, field_bytes
    from shardio.reading.catalog import find_key
    from shardio.reading.reader import open_dataset

    with dataset_errors(), open_dataset(dataset, remote=remote) as reader:
        index = find_key(reader, key)
        if index is None:
            raise click.ClickException(
                f"{dataset}: no sample has key {key!r}; list the keys with "
                f"`shardio ls {dataset}`"
            )
        sample = reader.get(index)
        name = field if field is not None else _default_field(
            sample, layout=reader.manifest.layout
        )
        if name not in sample or name in RESERVED_FIELDS:
            fields = [f for f in sample if f not in RESERVED_FIELDS]
            raise click.ClickException(
                f"sample {key!r} has no field {name!r}; its fields are "
                f"{', '.join(map(repr, fields))}"
            )
        data = field_bytes(sample[name])
        if output is None and _stdout_is_terminal() and not _is_text(data):
            raise click.UsageError(
                f"sample {key!r} field {name!r} is {format_size(len(data))} of binary data, "
                "which a terminal would show as garbage: write it to a file with "
                f"-o FILE, or redirect it: shardio cat {dataset} {key} > FILE")
        if output is not None:
            try:
                output.write_bytes(data)
            except OSError as exc:
                raise click.ClickException(f"{output}: {exc.strerror or exc}") from exc
            return
        stream = sys.stdout.buffer
        stream.write(data)
        stream.flush()


def _stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (binary bytes are never written to one)."""
    return sys.stdout.isatty()


def _is_text(data: bytes) -> bool:
    """Whether ``data`` is UTF-8 text a terminal shows as written (tabs and newlines allowed)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(char.isprintable() or char in "\t\n\r" for char in text)


COMMANDS = [info, ls, cat]


def _record_bytes(reader: DatasetReader, number: int, shard: Any, record: int,
                  by_offsets: bool) -> int:
    """Bytes record ``record`` of ``shard`` stores: its frame; in a v3 block, its values'."""
    if getattr(shard, "block_index", None) is not None:  # its values, offsets and key
        from shardio.format.blockfile import MIN_RECORD_BYTES, record_bytes
        from shardio.format.record import INDEX_FIELD, KEY_FIELD

        sample = reader.decode_run(number, record, record + 1, verify=False)[0]
        sample.pop(INDEX_FIELD, None)
        return record_bytes(sample) + len(sample[KEY_FIELD].encode()) + MIN_RECORD_BYTES
    return int(shard.offset(record + 1) - shard.offset(record) if by_offsets
               else len(shard.frame(record)))
