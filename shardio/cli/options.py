"""Shared click parameter types: human sizes (``256MB``) turned into bytes, local paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from shardio.errors import StorageError
from shardio.location import local_path

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


DATASET = LocalPath("dataset")
"""A dataset folder argument; a missing one is reported by ``read_manifest``, with the fix."""
