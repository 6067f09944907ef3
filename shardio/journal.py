"""The pack journal: what an interrupted pack leaves behind so that ``resume`` can finish it.

A writer that finishes a shard (written under a temporary name, fsynced,
renamed, folder fsynced) then records it in ``.shardio-pack.json`` next to the
shards, together with an *identity*: everything that must be equal for a
resumed pack to produce the same bytes (options, input listing, seed…). The
journal is replaced atomically, so it is always either the old or the new
state. This module owns the file and its checks; what the shard entries hold is
up to the writer (``ShardWriter`` and ``shardio.pack`` each keep their own).
A pack to a remote store keeps the same journal as an object
(``shardio.remotetarget``), checked by ``parse_journal``. Which names a pack
writes (``is_shardio_file``) decides what ``--overwrite`` may delete. It
imports only ``backends``, ``checksum``, ``errors`` and ``manifest`` from shardio.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from shardio.backends import SHARD_SUFFIX
from shardio.checksum import name_of
from shardio.errors import OutputExistsError, PackError
from shardio.manifest import MANIFEST_NAME, file_checksum

JOURNAL_NAME: Final = ".shardio-pack.json"


def write_journal(out: Path, state: Mapping[str, Any]) -> None:
    """Replace ``out``'s pack journal with ``state`` atomically (temporary file, fsync, rename).

    The journal is what ``resume`` trusts: write it only after the shards it
    lists are renamed into place and their folder is fsynced.
    """
    tmp = out / f"{JOURNAL_NAME}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / JOURNAL_NAME)


def open_journal(out: Path, identity: Mapping[str, Any]) -> dict[str, Any] | None:
    """Prepare ``out`` for a resume and return its journal, or None to start afresh.

    Removes the temporary files an interrupted writer left (partial shards, a
    half-written manifest), then checks that the journal was written for the
    same ``identity``. Returns None when ``out`` holds no journal and nothing else.

    Raises:
        OutputExistsError: ``out`` holds a complete dataset, or files but no journal.
        PackError: the journal was written for another identity (options or input).
    """
    for name in os.listdir(out):
        if name.startswith(".shard-") or name == f".{MANIFEST_NAME}.tmp":
            (out / name).unlink(missing_ok=True)
    journal = out / JOURNAL_NAME
    if (out / MANIFEST_NAME).exists():
        raise OutputExistsError(
            f"{out}: this dataset is already complete (it has a {MANIFEST_NAME}); "
            "there is nothing to resume. Use --overwrite to pack it again",
            path=out,
        )
    if not journal.exists():
        leftovers = [n for n in os.listdir(out) if n != JOURNAL_NAME]
        if leftovers:
            raise OutputExistsError(
                f"{out}: no pack journal ({JOURNAL_NAME}) to resume from, but the "
                f"folder is not empty; use --overwrite to start again",
                path=out,
            )
        return None
    return parse_journal(journal.read_bytes(), identity, where=str(out))


def parse_journal(data: bytes, identity: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """The journal state in ``data``, checked to be a pack with ``identity``.

    Args:
        data: the journal file's bytes (from a folder or an object store).
        identity: what the resuming pack would write; must equal the journal's.
        where: the output folder or URL, named in errors.

    Raises:
        PackError: the journal is damaged, or was written for another identity.
    """
    try:
        state = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        state = exc
    if not isinstance(state, dict):
        raise PackError(f"{where}: the pack journal {JOURNAL_NAME} is damaged ({state!r}); "
                        "use --overwrite to pack again", path=f"{where}/{JOURNAL_NAME}")
    if state.get("identity") != json.loads(json.dumps(dict(identity))):
        raise PackError(
            f"{where}: the interrupted pack used other options or input "
            f"({state.get('identity')}); resume with the same options, or use --overwrite",
            path=f"{where}/{JOURNAL_NAME}",
        )
    return state


def shard_is_intact(path: Path, num_bytes: int, checksum: str) -> bool:
    """Whether the finished shard at ``path`` still has the size and checksum journaled."""
    return path.exists() and path.stat().st_size == num_bytes and (
        file_checksum(path, name_of(checksum)) == checksum)


def is_shardio_file(name: str) -> bool:
    """Whether ``name`` is one shardio writes into a dataset (shards, journal, manifest, temps)."""
    return name in (
        MANIFEST_NAME,
        JOURNAL_NAME,
        f".{MANIFEST_NAME}.tmp",
        f"{JOURNAL_NAME}.tmp",
    ) or (
        name.startswith(("shard-", ".shard-"))
        and name.endswith(
            tuple(SHARD_SUFFIX.values())
            + tuple(s + ".tmp" for s in SHARD_SUFFIX.values())
            + tuple(s + "-lock" for s in SHARD_SUFFIX.values())
        )
    )


def refuse_to_clear(where: str, names: list[str], *, overwrite: bool) -> None:
    """Raise unless a non-empty output holding ``names`` may be cleared for a new pack."""
    if not overwrite:
        raise OutputExistsError(
            f"{where}: output is not empty ({len(names)} entries, e.g. {names[0]!r}); "
            "choose an empty folder or prefix, pass --overwrite to replace a dataset, or "
            "--resume to finish an interrupted pack",
            path=where,
        )
    foreign = [n for n in names if not is_shardio_file(n)]
    if foreign:
        raise OutputExistsError(
            f"{where}: refusing to overwrite an output that holds files shardio did not "
            f"write (e.g. {foreign[0]!r}); choose another output folder or prefix",
            path=where,
        )
