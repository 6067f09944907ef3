"""The ``shardio`` command line: one small module per command group, all calling the public API.

Sizes like ``256MB`` are parsed here and nowhere else; the library takes bytes.
"""

from __future__ import annotations

import importlib

import click

from shardio.version import __version__

COMMAND_MODULES = (
    "pack",
    "inspect",
    "verify",
    "unpack",
    "demo",
    "bench",
)
"""Modules under ``shardio.cli`` that each define click commands listed in their ``COMMANDS``."""


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardio")
def main() -> None:
    """Pack small files into shuffled, checksummed shards and stream them into PyTorch."""


for _name in COMMAND_MODULES:
    for _command in importlib.import_module(f"shardio.cli.{_name}").COMMANDS:
        main.add_command(_command)
