"""``shardio pack SRC OUT``: the command-line face of ``shardio.pack``.

Flags mirror the keyword arguments of ``shardio.pack``; sizes such as
``256MB`` are parsed here. The command prints the summary (or, with
``--json``, the summary as JSON) and turns shardio errors into a one-line
message and exit status 1. OUT may be a URL; SRC is a local folder.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click
from click.core import ParameterSource

from shardio.cli.options import DATASET, SIZE, LocalPath
from shardio.errors import ShardioError
from shardio.format.codecs import CODEC_NAMES, MAX_ZSTD_LEVEL, MIN_ZSTD_LEVEL
from shardio.format.manifest import BACKENDS
from shardio.packing.append import appended_options
from shardio.packing.engines import ENGINES
from shardio.packing.pack import PackSummary, pack
from shardio.packing.writer import DEFAULT_MAX_SHARD_BYTES, WriteOptions


def format_summary(summary: PackSummary) -> str:
    """The human-readable summary printed after a pack."""
    mode = ("ImageFolder" if summary.imagefolder else "class folders" if summary.class_folders
            else "generic folder")
    lines = [
        f"packed {summary.out} ({mode})",
        f"  samples       {summary.samples:,} ({summary.files:,} files)",
        f"  shards        {summary.shards:,}",
        f"  input bytes   {summary.input_bytes:,}",
        f"  output bytes  {summary.output_bytes:,}",
        f"  ratio         {summary.ratio:.3f} (output / input)",
        f"  seconds       {summary.seconds:.2f}",
        f"  files/s       {summary.files_per_s:,.0f} ({summary.mb_per_s:,.1f} MB/s)",
        f"  hidden        {summary.hidden_ignored:,} hidden entries ignored",
    ]
    if summary.existing_samples or summary.existing_skipped:
        lines.append(f"  appended to   {summary.existing_samples:,} samples already in the "
                     f"dataset ({summary.existing_samples + summary.samples:,} now)")
    if summary.existing_skipped:
        lines.append(f"  existing      {summary.existing_skipped:,} samples of SRC skipped: "
                     "their keys were in the dataset")
    if summary.resumed_samples:
        lines.append(f"  resumed       {summary.resumed_samples:,} samples were already packed")
    lines.append(f"  skipped       {len(summary.skipped):,} files")
    lines += [f"    {path}: {reason}" for path, reason in summary.skipped]
    return "\n".join(lines)


@click.command("pack")
@click.argument("src", type=LocalPath("source"))  # a folder, a tar, a glob or a brace pattern
@click.argument("out", type=DATASET)  # a folder or a URL (s3://…)
@click.option("--backend", type=click.Choice(BACKENDS), default="records", show_default=True,
              help="Shard file format.")
@click.option("--codec", type=click.Choice(CODEC_NAMES), default="zstd", show_default=True,
              help="Compression of records that are not already compressed media.")
@click.option("--level", type=click.IntRange(MIN_ZSTD_LEVEL, MAX_ZSTD_LEVEL), default=3,
              show_default=True,
              help="zstd level (negative: faster and larger); only with --codec zstd.")
@click.option("--max-shard-bytes", type=SIZE, default=DEFAULT_MAX_SHARD_BYTES,
              show_default="256MB", help="Start a new shard beyond this size.")
@click.option("--max-shard-samples", type=click.IntRange(min=1), default=None,
              help="Start a new shard after this many samples.")
@click.option("--format-version", type=click.Choice(["2", "3"]), default=None,
              help="The shard format to write (docs/format.md); default: this release's.")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Pack only files whose relative path matches (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Leave out files whose relative path matches (repeatable).")
@click.option("--follow-symlinks", is_flag=True, help="Pack what symbolic links point to.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the shuffle.")
@click.option("--no-shuffle", is_flag=True, help="Keep the sorted sample order.")
@click.option("--num-workers", type=click.IntRange(min=1), default=None,
              help="Processes that read and encode [default: all cores].")
@click.option("--imagefolder/--no-imagefolder", default=None,
              help="Treat SRC as an ImageFolder (class folders of images) or not "
                   "[default: detect: class folders of images, none sharing its name stem "
                   "with a non-image file such as x.jpg + x.json].")
@click.option("--class-folders", is_flag=True,
              help="Label every sample with its top-level folder, as torchvision's "
                   "DatasetFolder does for any file type: fields per file as in a generic "
                   "folder, plus `label` (the folder's index among SRC's sorted folders).")
@click.option("--from", "source_format",
              type=click.Choice(["folder", "webdataset", "table", "mds"]),
              default=None, help="What SRC is [default: WebDataset tar shards when SRC is a .tar, "
                                 "a folder of only .tar/.tar.gz files, a glob or "
                                 "train-{000000..000099}.tar; a table when SRC is a .parquet "
                                 "file, a folder of them or a datasets.save_to_disk folder; "
                                 "MDS when SRC holds a MosaicML Streaming index.json; "
                                 "else a folder of files].")
@click.option("--key-column", metavar="COLUMN", default=None,
              help="Tables and MDS: the column whose values are the keys [default: the row's "
                   "position].")
@click.option("--label-field", metavar="FIELD", default=None,
              help="WebDataset tars: the field (e.g. cls) whose text becomes `label` (integers "
                   "as they are; names numbered in sorted order as `classes`). MDS: the "
                   "integer column that becomes `label`.")
@click.option("--check-images/--no-check-images", default=None,
              help="Decode every image with Pillow (slow) [default: no; with --append, as the "
                   "dataset was packed]. Either way each JPEG, PNG and WebP is checked "
                   "complete (header and end marker or size), which costs no decode.")
@click.option("--skip-bad/--no-skip-bad", default=None,
              help="Leave out bad inputs (listed in the summary and manifest) instead of failing "
                   "[default: no; with --append, as the dataset was packed].")
@click.option("--overwrite", is_flag=True, help="Replace the dataset in OUT.")
@click.option("--resume", is_flag=True, help="Finish an interrupted pack into OUT.")
@click.option("--append", is_flag=True,
              help="Add SRC's files to the dataset in OUT as new shards (write options not "
                   "given are the dataset's; an interrupted append of the same SRC continues).")
@click.option("--skip-existing", is_flag=True,
              help="With --append: skip samples whose keys OUT already holds instead of failing.")
@click.option("--retry-skipped", is_flag=True,
              help="With --append: pack files OUT lists as skipped if they pass now (they are "
                   "otherwise left out again).")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True,
              help="Where SRC is walked and shards are built: this machine, or a Dask cluster "
                   "(pip install 'dask[distributed]'; SRC and a local OUT on a filesystem every "
                   "worker sees at the same path). The output is the same.")
@click.option("--scheduler", metavar="ADDRESS", default=None,
              help="With --engine dask: the scheduler, e.g. tcp://host:8786 [default: a local "
                   "cluster of --num-workers processes].")
@click.option("--force", is_flag=True,
              help="Pack SRC even when it is a shardio dataset (its shard files become samples).")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar [default: when stderr is a terminal].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def pack_command(
    src: Path, out: Path | str, backend: str, codec: str, level: int, max_shard_bytes: int,
    max_shard_samples: int | None, format_version: str | None, include: tuple[str, ...],
    exclude: tuple[str, ...],
    follow_symlinks: bool, seed: int, no_shuffle: bool, num_workers: int | None,
    imagefolder: bool | None, class_folders: bool, source_format: str | None,
    label_field: str | None, key_column: str | None, check_images: bool | None,
    skip_bad: bool | None, overwrite: bool, resume: bool, append: bool, skip_existing: bool,
    retry_skipped: bool, engine: str, scheduler: str | None, force: bool,
    progress: bool | None, as_json: bool,
) -> None:
    """Pack the files under SRC into shuffled, checksummed shards in OUT.

    OUT is a folder or a URL such as s3://bucket/prefix (shards are staged in
    $TMPDIR, uploaded one by one, the manifest last). An ImageFolder
    (SRC/<class>/**/<image>) becomes samples with fields `image` and `label`;
    any other folder groups files sharing a name up to the first dot into one
    sample (a/x.jpg + a/x.json -> key a/x); with --class-folders each such
    sample also gets the `label` of its top-level folder. WebDataset tar shards
    (a folder of them, a glob or train-{000000..000099}.tar) are read in place,
    their members grouped into samples as WebDataset groups them.
    """
    try:
        options = WriteOptions(
            backend=backend, codec=codec, level=level, max_shard_bytes=max_shard_bytes,
            max_shard_samples=max_shard_samples,
            **({} if format_version is None else {"version": int(format_version)}))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if ((skip_existing or retry_skipped) and not append) or (append and overwrite):
        raise click.UsageError("--skip-existing goes with --append (so does --retry-skipped), "
                               "and --append never "
                               "overwrites: leave --overwrite out")
    if scheduler is not None and engine != "dask":
        raise click.UsageError("--scheduler goes with --engine dask")
    if class_folders and imagefolder:
        raise click.UsageError("--class-folders labels generic samples; an ImageFolder is "
                               "labelled by its class folders already: pass one of the two")
    ctx = click.get_current_context()
    given = {name: value for name, value in (
        ("backend", backend), ("codec", codec), ("level", level),
        ("max_shard_bytes", max_shard_bytes), ("max_shard_samples", max_shard_samples))
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT}
    try:
        if append:  # the write options not on the command line are the dataset's
            options = appended_options(out, given) or options
        if options.codec == "none" and "level" in given:
            raise click.BadParameter("a level is zstd's, and the codec is 'none' (nothing "
                                     "is compressed): leave --level out, or pass --codec zstd",
                                     param_hint="'--level'")
        summary = pack(
            src, out, options=options, imagefolder=imagefolder, class_folders=class_folders,
            seed=seed,
            shuffle=not no_shuffle, num_workers=num_workers, include=include, exclude=exclude,
            follow_symlinks=follow_symlinks, check_images=check_images, skip_bad=skip_bad,
            overwrite=overwrite, resume=resume, append=append, skip_existing=skip_existing,
            retry_skipped=retry_skipped,
            progress=progress, engine=engine, scheduler=scheduler, force=force,
            source_format=source_format, label_field=label_field, key_column=key_column,
        )
    except ShardioError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt as exc:  # click would print a bare "Aborted!"
        _interrupted(ctx, exc, out, append=append)
    except OSError as exc:  # OUT is a file, a folder cannot be made, …: say which and why
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(f"{where}{exc.strerror or exc}") from exc
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1, ensure_ascii=False))
    else:
        click.echo(format_summary(summary))


def _interrupted(ctx: click.Context, exc: KeyboardInterrupt, out: Path | str, *,
                 append: bool) -> None:
    """Say what a Ctrl-C kept and the command that finishes the pack; exit 130 as shells do."""
    notes = getattr(exc, "__notes__", [])  # shardio.pack's: what it kept, and where
    kept = notes[0] if notes else f"no shard was finished yet; whatever {out} holds is kept"
    click.echo(f"Interrupted: {kept}. Finish the pack with:\n  {resume_command(ctx, append)}",
               err=True)
    ctx.exit(130)


def resume_command(ctx: click.Context, append: bool) -> str:
    """This command as given, without --overwrite, with --resume: the line that finishes it.

    An interrupted append continues when the same command runs again (``--append``).
    """
    words = ["shardio", "pack"]
    for param in ctx.command.params:
        name, value = param.name or "", ctx.params.get(param.name or "")
        if isinstance(param, click.Argument):
            words.append(str(value))
        elif (isinstance(param, click.Option) and name not in ("overwrite", "resume")
              and ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)):
            if param.is_flag and param.secondary_opts:
                words.append(param.opts[0] if value else param.secondary_opts[0])
            elif param.is_flag:
                words += [param.opts[0]] if value else []
            else:
                words += [w for v in (tuple(value or ()) if param.multiple else [value])
                          for w in (param.opts[0], str(v))]
    return shlex.join(words if append else [*words, "--resume"])


COMMANDS = [pack_command]
