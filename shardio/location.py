"""Where a dataset or source lives: a local folder today; URLs are refused, never misread.

Without this check ``shardio pack SRC s3://bucket/x`` wrote a local folder named
``s3:``. ``local_path`` is the one place that decides; remote storage (a later
release) replaces it with a function that returns a store for a URL. Imports
nothing from shardio but ``errors``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from shardio.errors import StorageError

_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""``scheme://`` at the start: s3://, gs://, https://, file://, hf://, …"""


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` starts with ``scheme://``."""
    return _URL.match(os.fspath(location)) is not None


def local_path(location: str | os.PathLike[str], *, role: str = "dataset") -> Path:
    """``location`` as a local path; refuses ``scheme://`` URLs.

    Args:
        location: a folder path (or a URL, refused).
        role: what the location is for, named in the message ("dataset", "source", …).

    Raises:
        StorageError: ``location`` is a URL; remote datasets are not supported yet.
    """
    if is_url(location):
        text = os.fspath(location)
        raise StorageError(
            f"{text}: the {role} is a URL, and remote datasets are not supported yet; "
            "shardio reads and writes local folders only. Copy it to a local folder first "
            "(for example with `aws s3 sync` or `gsutil rsync`) and pass that folder's path",
            path=text)
    return Path(location)
