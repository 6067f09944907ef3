"""``shardio doctor``: run a dataset's loader against a simulated step and say what bounds it.

A thin front for ``shardio.doctor`` (which needs torch): the text report, or JSON with
``--json``, and a PNG of the per-step wait with ``--plot``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from shardio.cli.inspect import DATASET
from shardio.cli.options import LocalPath


@click.command(name="doctor")
@click.argument("path", type=DATASET, metavar="DATASET")
@click.option("--step-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="The simulated training step, in milliseconds.")
@click.option("--steps", "num_steps", type=click.IntRange(min=2), default=100,
              show_default=True, help="Steps to time.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--num-workers", type=click.IntRange(min=0), default=None,
              help="DataLoader workers (default: shardio.loader's).")
@click.option("--decode", type=click.Choice(["auto", "raw", "pil", "tensor"]),
              default="auto", show_default=True)
@click.option("--image-size", type=click.IntRange(min=1), default=224, show_default=True,
              help="The side the model takes (judges decoding at a smaller size).")
@click.option("--no-verify", is_flag=True,
              help="Do not apply and measure the first recommendation.")
@click.option("--plot", type=LocalPath("plot", dir_okay=False), default=None,
              help="Write a PNG of the per-step wait, the stages stacked.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor_command(path: Path | str, step_ms: float, num_steps: int, batch_size: int,
                   num_workers: int | None, decode: str, image_size: int, no_verify: bool,
                   plot: Path | None, as_json: bool) -> None:
    """Run DATASET's loader against a simulated step; name the bottleneck and the fix."""
    from shardio.cli.inspect import dataset_errors
    from shardio.torch.doctor import doctor, draw_plot, format_report

    with dataset_errors():
        report = doctor(str(path), step_ms=step_ms, num_steps=num_steps,
                        batch_size=batch_size, num_workers=num_workers, decode=decode,
                        image_size=image_size, verify=not no_verify)
    if plot is not None:
        draw_plot(report, plot)
    click.echo(json.dumps(report) if as_json else format_report(report))


COMMANDS = [doctor_command]
