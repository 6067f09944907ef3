"""``shardio bench``: measure read throughput on this machine and recommend settings.

A thin front for ``shardio.torch.bench.bench`` (which needs torch); prints one line
per setting as it is measured, then the recommendation (or why there is none),
or JSON with ``--json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

import shardio
from shardio.cli.inspect import DATASET, dataset_errors
from shardio.cli.options import remote_options
from shardio.storage.options import RemoteOptions


@click.command(name="bench")
@click.argument("path", type=DATASET, metavar="DATASET")
@click.option(
    "--max-workers",
    type=click.IntRange(min=0),
    default=None,
    envvar="SHARDIO_BENCH_MAX_WORKERS",
    show_envvar=True,
    help="Highest num_workers to try (default: the core count).",
)
@click.option(
    "--min-seconds",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    envvar="SHARDIO_BENCH_MIN_SECONDS",
    show_envvar=True,
    help="Time each setting for at least this long (epochs repeat on small datasets).",
)
@click.option(
    "--max-samples",
    type=click.IntRange(min=1),
    default=None,
    help="Stop each setting after this many samples (a quick look: too short to recommend).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--mode",
    "modes",
    type=click.Choice(["raw", "tensor"]),
    multiple=True,
    help="What to measure (repeatable; default: raw, and tensor on ImageFolder packs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@remote_options
def bench_command(
    path: Path | str,
    max_workers: int | None,
    min_seconds: float,
    max_samples: int | None,
    batch_size: int,
    modes: tuple[str, ...],
    as_json: bool,
    remote: RemoteOptions,
) -> None:
    """Read DATASET with 0, 1, 2, … workers and recommend num_workers and shuffle_buffer."""
    from shardio.torch.bench import BenchRow, bench, bench_modes

    if math.isnan(min_seconds):  # FloatRange lets nan through: every comparison is false
        raise click.BadParameter("nan is not a duration: give seconds, e.g. 2",
                                 param_hint="'--min-seconds'")

    def show(row: BenchRow) -> None:
        if not as_json:
            click.echo(
                f"{row.mode:>6}  workers={row.num_workers}  {row.samples_per_s:>10,.0f} samples/s"
                f"  {row.mb_per_s:>8.1f} MB/s  CPU {row.cpu_percent:>4.0f}%"
                f"  ({row.samples:,} samples in {row.seconds:.2f} s"
                f"{'' if row.measured else ', too short to measure'})"
            )

    with dataset_errors():
        manifest = shardio.read_manifest(path, remote=remote)
        try:
            bench_modes(manifest, modes)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--mode'") from exc
        if not as_json:
            click.echo(f"{path}: reading with batch size {batch_size}…")
        report = bench(
            path,
            max_workers=max_workers,
            min_seconds=min_seconds,
            max_samples=max_samples,
            batch_size=batch_size,
            modes=modes or None,
            on_row=show,
            remote=remote,
        )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    workers = report.recommended_num_workers
    click.echo(
        f"recommended: num_workers={'none (too short to measure)' if workers is None else workers}"
        f", shuffle_buffer={report.recommended_shuffle_buffer}"
    )
    for note in report.notes:
        click.echo(f"note: {note}")


COMMANDS = [bench_command]
