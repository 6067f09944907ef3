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
from shardio.storage.location import is_url, local_path
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
        try:
            size = value if isinstance(value, int) else parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if size < 1:  # every size here bounds something that must hold at least a byte
            self.fail(f"{value!r} is no size: give 1 byte or more, e.g. 256MB", param, ctx)
        return size


SIZE = SizeParam()


class LocalPath(click.Path):
    """A local folder argument; a ``scheme://`` URL is refused with the reason (``local_path``)."""

    def __init__(self, role: str, **kwargs: Any) -> None:
        super().__init__(path_type=Path, **kwargs)
        self.role = role

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        if isinstance(value, str) and not value.strip():  # Path("") would be this folder
            self.fail(f"is empty: give the {self.role} folder's path", param, ctx)
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
        if not text.strip():  # Path("") is ".": an empty argument would name this folder
            self.fail("is empty: give a dataset folder or a URL such as s3://bucket/train",
                      param, ctx)
        if not is_url(text):
            return Path(text)
        scheme, _, rest = text.partition("://")
        if not rest.strip("/"):
            self.fail(f"{text!r} names no bucket or host after {scheme}://: give one, as in "
                      "s3://bucket/train or https://host/train",
                      param, ctx)
        if not _known_scheme(scheme.lower()):
            self.fail(f"{text!r}: no storage is known for the scheme {scheme!r}; shardio reads "
                      "local folders and fsspec URLs such as s3://, gs://, az://, https://, "
                      "hf:// (a typo?)", param, ctx)
        return text


def _known_scheme(scheme: str) -> bool:
    """Whether fsspec has a filesystem for ``scheme``; without fsspec, the reader says what to
    install, so every scheme passes here."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return True
    return scheme in known_implementations or scheme in registry


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
        "--cache-dir", type=LocalPath("node cache", file_okay=False), default=None,
        help="Node cache folder for a URL DATASET, shared by the node's processes (default: "
             "$SHARDIO_CACHE_DIR, else ~/.cache/shardio).")(sized)
