"""``shardio verify``: check a dataset and say, shard and record, what is wrong with it.

A thin front for ``shardio.ops.verify.verify``; exit status 0 when the dataset is
clean and 1 when any fault is found, so scripts and CI can gate on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from shardio.cli.inspect import DATASET, format_size
from shardio.cli.options import remote_options
from shardio.ops.verify import VerifyReport, verify
from shardio.storage.options import RemoteOptions


def _describe(report: VerifyReport, dataset: Path | str) -> str:
    checked = "shard checksums" if report.quick else (
        f"{report.num_records:,} records, images " + ("decoded" if report.images else
                                                       "complete"))
    where = f"{dataset}: {report.num_shards} shard(s), {checked}, {format_size(report.num_bytes)}"
    if report.ok:
        return f"{where} checked in {report.seconds:.2f} s: OK"
    return f"{where} checked in {report.seconds:.2f} s: {len(report.faults)} fault(s)"


@click.command(name="verify")
@click.argument("dataset", type=DATASET)
@click.option("--quick", is_flag=True,
              help="Check the manifest, shard sizes and shard checksums only; read no records.")
@click.option("--images", is_flag=True,
              help="Also decode every image with Pillow (slow); a fault names the shard, "
                   "record and key of each image that fails.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object (ok, counts, faults), nothing else.")
@remote_options
def verify_command(dataset: Path | str, quick: bool, images: bool, as_json: bool,
                   remote: RemoteOptions) -> None:
    """Check every shard and record of DATASET.

    Checks the manifest, each shard's size and checksum, each record's checksum,
    framing, key and fields, and that each image is complete (its header parses
    and its end marker is there, as `shardio pack` checks); --images decodes each
    image as well. Exits with status 1 and one line per fault (naming the shard
    file, the record and its key) when anything is wrong, 0 when the dataset is
    clean; the same with --json, whose report lists the faults.
    """
    if quick and images:
        raise click.UsageError("--quick reads no records, so no images: pass one of the two")
    report = verify(dataset, quick=quick, images=images,
                    progress=not as_json and sys.stderr.isatty(), remote=remote)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1, ensure_ascii=False))
    elif not report.ok and report.num_shards == 0:  # nothing checked: no manifest to go by
        raise click.ClickException(f"not verified: {report.faults[0].message}")
    else:
        for fault in report.faults:
            where = fault.shard if fault.record is None else f"{fault.shard} record {fault.record}"
            click.echo(f"FAULT {where}: {fault.message}", err=True)
        click.echo(_describe(report, dataset))
    if not report.ok:
        sys.exit(1)


COMMANDS = [verify_command]
