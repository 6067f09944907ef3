"""Shared click parameters: human sizes (``256MB``) turned into bytes, local paths, datasets
(a folder or a URL), and the node cache options of the commands that read datasets."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from shardio.errors import StorageError
from shardio.location import is_url, local_path
from shardio.storage.options import RemoteOptions

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9,
          "GB": 10**9, "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}


def parse_size(text: str) -> int:
    """Bytes in a size such as ``256MB``, ``1.5GiB`` or ``4096``."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 64KB, 256MB, 1GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


class SizeParam(click.ParamType):  # type: ignore[type-arg]
    """A click parameter holding a byte size written like ``256MB``."""

    name = "size"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeParam()


class LocalPath(click.Path):
    """A local folder argument; a ``scheme://`` URL is refused with the reason (``local_path``)."""

    def __init__(self, role: str, **kwargs: Any) -> None:
        super().__init__(path_type=Path, **kwargs)
        self.role = role

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        try:
            local_path(value, role=self.role)
        except StorageError as exc:
            self.fail(str(exc), param, ctx)
        return super().convert(value, param, ctx)


class DatasetParam(click.ParamType):  # type: ignore[type-arg]
    """A dataset argument: a local folder (a ``Path``) or a URL such as ``s3://bucket/train``
    (kept as a ``str``; its credentials come from the backend's environment, e.g. ``AWS_*``)."""

    name = "dataset"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Path | str:
        if isinstance(value, Path):
            return value
        text = str(value)
        return text if is_url(text) else Path(text)


DATASET = DatasetParam()
"""A dataset folder or URL; a missing one is reported by ``read_manifest``, with the fix."""

F = TypeVar("F", bound=Callable[..., Any])


def remote_options(command: F) -> F:
    """Add ``--cache-dir`` and ``--max-cache-bytes``; the command receives ``remote``, a
    ``RemoteOptions`` (they matter only when DATASET is a URL)."""

    @functools.wraps(command)
    def with_remote(*args: Any, cache_dir: Path | None, max_cache_bytes: int | None,
                    **kwargs: Any) -> Any:
        if max_cache_bytes is not None and max_cache_bytes <= 0:
            raise click.BadParameter(f"must be positive, got {max_cache_bytes}",
                                     param_hint="--max-cache-bytes")
        kwargs["remote"] = RemoteOptions(cache_dir=cache_dir, max_cache_bytes=max_cache_bytes)
        return command(*args, **kwargs)

    sized = click.option(
        "--max-cache-bytes", type=SIZE, default=None, envvar="SHARDIO_MAX_CACHE_BYTES",
        show_envvar=True,
        help="Hard budget of the node cache folder for a URL DATASET, e.g. 50GB (default: "
             "half the free space of its disk, at most 100 GB).")(with_remote)
    return click.option(  # type: ignore[return-value]  # click keeps the wrapped signature
        "--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Node cache folder for a URL DATASET, shared by the node's processes (default: "
             "$SHARDIO_CACHE_DIR, else ~/.cache/shardio).")(sized)
