"""The ``shardio`` command line: one small module per command group, all calling the public API.

Sizes like ``256MB`` are parsed here and nowhere else; the library takes bytes.
A command's module is imported only when that command runs, so ``shardio --help``
imports click and nothing heavy (no torch, numpy, zstandard, lmdb, Pillow, tqdm).
Every failure ends in one ``Error:`` line and exit status 1; ``--debug`` (or
``SHARDIO_DEBUG=1``) also prints the traceback behind it.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any, Final

import click

from shardio.version import __version__

COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "pack": ("pack", "Pack the files under SRC into shuffled, checksummed shards in OUT."),
    "merge": ("merge", "Merge several datasets into one new dataset OUT, without re-encoding."),
    "info": ("inspect", "Show what the manifest of DATASET says."),
    "ls": ("inspect", "List the samples of DATASET: stored size, label and key."),
    "cat": ("inspect", "Print the raw bytes of one field of sample KEY."),
    "preview": ("preview", "Draw a contact sheet of random samples of DATASET with their "
                           "labels."),
    "verify": ("verify", "Check every shard and record of DATASET."),
    "unpack": ("unpack", "Restore the files of DATASET into DEST, byte for byte."),
    "demo": ("demo", "Generate, pack, verify and stream a small demo dataset."),
    "bench": ("bench", "Read DATASET with 0, 1, 2, … workers and recommend num_workers "
                       "and shuffle_buffer."),
    "doctor": ("doctor", "Run DATASET's loader against a simulated step; name the bottleneck "
                         "and the fix."),
}
"""Command name -> (module under ``shardio.cli`` defining it in its ``COMMANDS``, short help).

The short help is repeated here so that ``--help`` lists the commands without
importing them; ``tests/cli/test_cli.py`` checks it equals each command's own.
"""


def load_command(name: str) -> click.Command:
    """Import the module of command ``name`` and return the command."""
    module = importlib.import_module(f"shardio.cli.{COMMANDS[name][0]}")
    command: click.Command = next(c for c in module.COMMANDS if c.name == name)
    return command


class LazyGroup(click.Group):
    """A group whose commands are imported when invoked, not when listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; what it raises ends in one ``Error:`` line, with the traceback
        behind it only under ``--debug``."""
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, EOFError) as exc:
            if isinstance(exc, click.ClickException):  # may quote the URL the user gave
                from shardio.errors import without_url_secrets

                exc.message = without_url_secrets(exc.message)  # type: ignore[misc]
            if ctx.params.get("debug"):
                cause = sys.exc_info()[1]
                if cause is not None and cause.__cause__ is not None:
                    traceback.print_exception(type(cause.__cause__), cause.__cause__,
                                              cause.__cause__.__traceback__)
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            from shardio.storage.retry import describe  # its text without URL secrets

            raise click.ClickException(
                f"{describe(exc)} (unexpected: run again with --debug, or SHARDIO_DEBUG=1, to "
                "see where, and report it)") from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])


@click.group(cls=LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardio")
@click.option("--debug", is_flag=True, envvar="SHARDIO_DEBUG", show_envvar=True,
              help="On an error, also print the traceback behind it.")
def main(debug: bool) -> None:
    """Pack small files into shuffled, checksummed shards and stream them into PyTorch."""
