"""``shardio bench``: measure read throughput on this machine and recommend settings.

A thin front for ``shardio.bench.bench`` (which needs torch); prints one line
per setting as it is measured, then the recommendation, or JSON with ``--json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

import shardio
from shardio.cli.inspect import DATASET, dataset_errors


@click.command(name="bench")
@click.argument("path", type=DATASET)
@click.option(
    "--max-workers",
    type=click.IntRange(min=0),
    default=None,
    help="Highest num_workers to try (default: the core count).",
)
@click.option(
    "--max-samples",
    type=click.IntRange(min=1),
    default=None,
    help="Samples read per setting (default: 20,000 raw, 2,000 decoded).",
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
def bench_command(
    path: Path,
    max_workers: int | None,
    max_samples: int | None,
    batch_size: int,
    modes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Read dataset PATH with 0, 1, 2, … workers and recommend num_workers and shuffle_buffer."""
    from shardio.bench import BenchRow, bench

    def show(row: BenchRow) -> None:
        if not as_json:
            click.echo(
                f"{row.mode:>6}  workers={row.num_workers}  {row.samples_per_s:>10,.0f} samples/s"
                f"  {row.mb_per_s:>8.1f} MB/s  CPU {row.cpu_percent:>4.0f}%"
            )

    with dataset_errors():
        shardio.read_manifest(path)
        if not as_json:
            click.echo(f"{path}: reading with batch size {batch_size}…")
        report = bench(
            path,
            max_workers=max_workers,
            max_samples=max_samples,
            batch_size=batch_size,
            modes=modes or None,
            on_row=show,
        )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    click.echo(
        f"recommended: num_workers={report.recommended_num_workers}, "
        f"shuffle_buffer={report.recommended_shuffle_buffer}"
    )
    for note in report.notes:
        click.echo(f"note: {note}")


COMMANDS = [bench_command]
