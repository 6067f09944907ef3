"""``shardio merge DATASET... OUT``: the command-line face of ``shardio.merge``.

Flags mirror its keywords (``--prefix-keys`` ↔ ``prefix_keys``, ``--copy`` ↔
``link=False``). Prints the summary, or with ``--json`` the summary as JSON;
shardio errors become a one-line message and exit status 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from shardio.cli.inspect import dataset_errors, format_size
from shardio.cli.options import LocalPath
from shardio.ops.merge import merge


@click.command("merge")
@click.argument("inputs", nargs=-1, required=True, metavar="DATASET...",
                type=LocalPath("merge input", file_okay=False))
@click.argument("out", type=LocalPath("merge output", file_okay=False))
@click.option("--prefix-keys", is_flag=True,
              help="Name every sample <input folder name>/<key> (when keys collide); the "
                   "shards are then rewritten, field bytes kept.")
@click.option("--copy", "copy", is_flag=True,
              help="Copy shard files instead of hard-linking them.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def merge_command(inputs: tuple[Path, ...], out: Path, prefix_keys: bool, copy: bool,
                  as_json: bool) -> None:
    """Merge several datasets into one new dataset OUT, without re-encoding.

    Shard files are hard-linked when on OUT's filesystem (copied otherwise) and
    renamed in sequence; the manifests are combined, OUT's written last. The
    inputs must share backend, codec and classes, and OUT must be absent or
    empty. Keys found in two inputs are refused unless --prefix-keys.
    """
    with dataset_errors():
        summary = merge(inputs, out, prefix_keys=prefix_keys, link=not copy)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1, ensure_ascii=False))
        return
    how = ", ".join(f"{n} {what}" for what, n in (
        ("linked", summary.linked), ("copied", summary.copied),
        ("rewritten with prefixed keys", summary.rewritten)) if n)
    count = len(summary.inputs)
    click.echo(f"merged {count} dataset{'s' * (count != 1)} into {summary.out}: "
               f"{summary.samples:,} samples in {summary.shards:,} shards "
               f"({format_size(summary.output_bytes)}; {how}) in {summary.seconds:.2f} s")


COMMANDS = [merge_command]
