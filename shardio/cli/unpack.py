"""``shardio unpack``: restore the files a dataset was packed from.

A thin front for ``shardio.ops.unpack.unpack``, which refuses keys that would
write outside DEST and existing files unless ``--overwrite``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from shardio.cli.inspect import DATASET, dataset_errors, format_size
from shardio.cli.options import SIZE, LocalPath, remote_options
from shardio.ops.unpack import DEFAULT_TAR_SHARD_BYTES, unpack, unpack_webdataset
from shardio.storage.options import RemoteOptions


@click.command(name="unpack")
@click.argument("out", type=DATASET, metavar="DATASET")
@click.argument("dest", type=LocalPath("destination", file_okay=False))
@click.option("--format", "out_format", type=click.Choice(["files", "webdataset"]),
              default="files", show_default=True,
              help="files: the files the dataset was packed from; webdataset: tar shards "
                   "DEST/shard-000000.tar, … that webdataset.WebDataset reads.")
@click.option("--shard-bytes", type=SIZE, default=DEFAULT_TAR_SHARD_BYTES, show_default="1GiB",
              help="With --format webdataset: start a new tar beyond this size.")
@click.option("--overwrite", is_flag=True, help="Replace files that already exist in DEST.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@remote_options
def unpack_command(out: Path | str, dest: Path, out_format: str, shard_bytes: int,
                   overwrite: bool, as_json: bool, remote: RemoteOptions) -> None:
    """Restore the files of DATASET into DEST, byte for byte.

    ImageFolder packs become DEST/<class>/<image>; other packs one file per
    field. Keys that would land outside DEST are refused before anything is
    written. With --format webdataset, DEST gets tar shards instead, one
    <key>.<field> member per field (an ImageFolder's label as <key>.cls).
    """
    show = not as_json and sys.stderr.isatty()
    with dataset_errors():
        summary = unpack_webdataset(
            out, dest, max_shard_bytes=shard_bytes, overwrite=overwrite, progress=show,
            remote=remote) if out_format == "webdataset" else unpack(
            out, dest, overwrite=overwrite, progress=show, remote=remote)
    if as_json:
        click.echo(json.dumps(asdict(summary)))
        return
    click.echo(f"unpacked {summary.num_samples:,} samples into {summary.num_files:,} files "
               f"({format_size(summary.num_bytes)}) under {dest} in {summary.seconds:.2f} s")


COMMANDS = [unpack_command]
