"""``shardio preview``: a contact sheet of random samples, to look at before a long run.

A thin front for ``shardio.ops.preview.make_sheet``: it picks where the image
goes (``-o FILE``; without it a temporary file on a terminal, or the PNG on
stdout when that is a pipe) and prints the fields the sheet cannot show
(generic packs) as ``key  field=repr`` lines.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from shardio.cli.inspect import DATASET, dataset_errors
from shardio.cli.options import LocalPath, remote_options
from shardio.storage.options import RemoteOptions


def _stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (a PNG is never written to one)."""
    return sys.stdout.isatty()


@click.command(name="preview")
@click.argument("dataset", type=DATASET)
@click.option("-o", "--output", type=LocalPath("output", dir_okay=False), default=None,
              help="Image file to write (PNG unless its suffix says otherwise). Default: a "
                   "temporary file on a terminal, the PNG on stdout when piped.")
@click.option("--n", "num_samples", type=click.IntRange(min=1), default=64, show_default=True,
              help="How many samples to draw.")
@click.option("--class", "class_name", default=None,
              help="Only samples of this class (ImageFolder packs).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Another seed draws another random selection.")
@remote_options
def preview_command(dataset: Path | str, output: Path | None, num_samples: int,
                    class_name: str | None, seed: int, remote: RemoteOptions) -> None:
    """Draw a contact sheet of random samples of DATASET with their labels.

    Each thumbnail is captioned with its sample's key (on ImageFolder packs
    it starts with the class; with --class it is left out). Generic packs show
    their image fields (image, jpg, png, webp, …), and their other fields are
    printed as key  field=repr lines.
    """
    from shardio.ops.preview import make_sheet

    try:
        with dataset_errors():
            sheet = make_sheet(dataset, n=num_samples, class_name=class_name, seed=seed,
                               remote=remote)
    except ValueError as exc:  # a wrong --class (dataset errors became ClickExceptions above)
        raise click.UsageError(str(exc)) from exc
    piped = output is None and not _stdout_is_terminal()
    for sample in sheet.samples:
        if sample.others:
            fields = "  ".join(f"{name}={shown}" for name, shown in sample.others)
            click.echo(f"{sample.key}  {fields}", err=piped)
    for problem in sheet.problems:
        click.echo(f"warning: {problem}", err=True)
    if piped:
        sheet.image.save(sys.stdout.buffer, format="PNG")
        sys.stdout.buffer.flush()
        return
    if output is None:
        handle, name = tempfile.mkstemp(prefix="shardio-preview-", suffix=".png")
        output = Path(name)
        with open(handle, "wb") as fh:
            sheet.image.save(fh, format="PNG")
    else:
        try:
            sheet.image.save(output, format=None if output.suffix else "PNG")
        except (ValueError, KeyError) as exc:  # Pillow knows no format for the suffix
            raise click.BadParameter(f"{output}: cannot write this image format ({exc}); "
                                     "use .png or .jpg", param_hint="-o") from exc
        except OSError as exc:
            raise click.ClickException(f"{output}: {exc.strerror or exc}") from exc
    click.echo(str(output))


COMMANDS = [preview_command]
