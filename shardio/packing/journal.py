"""The pack journal: what an interrupted pack leaves behind so that ``resume`` can finish it.

A writer that finishes a shard (written under a temporary name, fsynced,
renamed, folder fsynced) then records it in ``.shardio-pack.json`` next to the
shards, together with an *identity*: everything that must be equal for a
resumed pack to produce the same bytes (options, input listing, seed…). The
journal is JSON Lines: a first line of what is not a shard, then a line a finished
shard, appended and fsynced (``JournalWriter``); it is replaced atomically only when
the first line changes, so it always reads as some complete state. This module owns
the file and its checks; what the shard entries hold is up to the writer
(``ShardWriter`` and ``shardio.pack`` each keep their own).
A pack to a remote store keeps the same journal as an object
(``shardio.packing.remote_target``), checked by ``parse_journal``. Which names a pack
writes (``is_shardio_file``) decides what ``--overwrite`` may delete. Every
writer of a local dataset holds its write lock (``dataset_lock``) throughout,
so writers take turns; readers never take it. It imports only ``backends``,
``checksum``, ``errors`` and ``manifest`` from shardio.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from shardio.backends import SHARD_SUFFIX
from shardio.errors import DatasetLockedError, OutputExistsError, PackError
from shardio.format.checksum import name_of
from shardio.format.manifest import JOURNAL_NAME, MANIFEST_NAME, file_checksum

LOCK_NAME: Final = ".shardio-lock"
"""The write lock of a local dataset, present while a writer holds it; readers ignore it."""
LOCK_WAIT_S = 60.0
"""How long a writer waits for another before ``DatasetLockedError``: enough for two small
appends started together to take turns, and bounded, so that a stopped holder (Ctrl-Z, a
suspended job) ends in an error naming it instead of a hang."""


@contextlib.contextmanager
def dataset_lock(out: Path, what: str) -> Iterator[None]:
    """Hold the write lock of the local dataset ``out`` for the block, waiting for another writer.

    Every writer of a local dataset (pack, with ``--overwrite`` or ``--resume``,
    append, merge into it) holds it from reading the old manifest to renaming
    the new one in, so two never interleave. Readers never take it: they see the
    old manifest or the new. It is an ``flock`` on ``LOCK_NAME`` in ``out``, so it
    dies with its process; the file says who holds it, and is removed on release
    (with ``out`` itself when this call created it and it is still empty, as after
    a pack that failed before writing).

    Args:
        out: the dataset folder; created if absent.
        what: the operation, named to a writer that has to wait (``"pack --append"``).

    Raises:
        DatasetLockedError: another process held the lock for ``LOCK_WAIT_S``.
    """
    made = not out.exists()
    fd = _take_lock(out, what)
    try:
        yield
    finally:
        (out / LOCK_NAME).unlink(missing_ok=True)  # under the lock: a waiter on it tries anew
        fcntl.flock(fd, fcntl.LOCK_UN)  # forked workers share the descriptor: unlock for all
        os.close(fd)
        if made:
            with contextlib.suppress(OSError):  # not empty: the writer wrote a dataset
                out.rmdir()


def _take_lock(out: Path, what: str) -> int:
    """An open descriptor of ``out/LOCK_NAME`` holding its flock, the holder's name written."""
    path = out / LOCK_NAME
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        out.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # a writer that created the folder just removed it
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 1024, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            if time.monotonic() >= deadline:
                raise DatasetLockedError(
                    f"{out}: another shardio writer is writing this dataset "
                    f"({holder or 'a process that has not named itself yet'}) and still held "
                    f"its lock ({LOCK_NAME}) after {LOCK_WAIT_S:g} s; one writer at a time, so "
                    "that no sample is lost. Run this again once it has finished (readers are "
                    "not affected); if that process is stopped (Ctrl-Z, a suspended job), "
                    "resume or end it", path=out) from None
            time.sleep(0.05)
            continue
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:  # not a file the last holder removed while this one waited on it
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {what}, since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
            return fd
        os.close(fd)


def dataset_entries(out: Path) -> list[str]:
    """The names in the folder ``out``, its write lock left out (a writer that holds it looks)."""
    return [name for name in os.listdir(out) if name != LOCK_NAME]


def journal_bytes(state: Mapping[str, Any]) -> bytes:
    """``state`` (``{"shards": [entry, ...], ...}``) as a journal stores it, in JSON Lines."""
    return _lines([{k: v for k, v in state.items() if k != "shards"}, *state["shards"]])


def _lines(items: Iterable[Any]) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def load_journal(data: bytes) -> dict[str, Any]:
    """The state in a journal's bytes: its first line with ``shards`` its other lines (after
    any the first line lists itself, as a journal written whole as one JSON object did).

    A last line cut short is a shard whose append a kill interrupted: not journaled.

    Raises:
        ValueError: not a journal.
    """
    lines = data.split(b"\n")
    state = json.loads(lines[0])
    if not isinstance(state, dict):
        raise ValueError("its first line is not an object")
    shards = list(state.get("shards", []))
    rest = [line for line in lines[1:] if line.strip()]
    for number, line in enumerate(rest):
        try:
            shards.append(json.loads(line))
        except ValueError:
            if number < len(rest) - 1 or data.endswith(b"\n"):
                raise
    state["shards"] = shards
    return state


class JournalWriter:
    """Writes a local pack's journal: a finished shard is one line appended and fsynced, so a
    pack of n shards writes n lines, not n journals of up to n entries (1,200 one-sample
    shards: 15-16 s rewriting the whole journal each time, 2.1-2.3 s appending; ``python -c
    "from shardio.synth import make_tiny_tree; make_tiny_tree('t', num_files=1200)"`` then
    ``time shardio pack t out --max-shard-samples 1 --num-workers 1``).

    The journal is what ``resume`` trusts: write it only after the shards it lists are
    renamed into place and their folder is fsynced.
    """

    def __init__(self, out: Path) -> None:
        self.path = out / JOURNAL_NAME
        self._head = ""
        self._count = 0

    def write(self, state: Mapping[str, Any]) -> None:
        """Journal ``state``: its shards after those of the last ``write`` are appended when
        all else is as it was, else the whole journal is replaced atomically (temporary
        file, fsync, rename)."""
        shards = state["shards"]
        head = json.dumps({k: v for k, v in state.items() if k != "shards"})
        if head == self._head and self._count <= len(shards) and self.path.exists():
            with open(self.path, "ab") as fh:
                fh.write(_lines(shards[self._count:]))
                fh.flush()
                os.fsync(fh.fileno())
        else:
            tmp = self.path.with_name(f"{JOURNAL_NAME}.tmp")
            with open(tmp, "wb") as fh:
                fh.write(journal_bytes(state))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        self._head, self._count = head, len(shards)


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
        leftovers = [n for n in dataset_entries(out) if n != JOURNAL_NAME]
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
        state: Any = load_journal(data)
    except (UnicodeDecodeError, ValueError) as exc:
        state = exc
    if not isinstance(state, dict):
        raise PackError(f"{where}: the pack journal {JOURNAL_NAME} is damaged ({state!r}); "
                        "use --overwrite to pack again", path=f"{where}/{JOURNAL_NAME}")
    wanted = json.loads(json.dumps(dict(identity)))
    if state.get("identity") != wanted:
        raise PackError(
            f"{where}: the interrupted pack used other options or input: "
            f"{identity_changes(state.get('identity'), wanted)}. Resume with the SRC and options "
            "it began with, or use --overwrite to start again",
            path=f"{where}/{JOURNAL_NAME}",
        )
    return state


def identity_changes(old: Any, new: Mapping[str, Any]) -> str:
    """What differs between a journal's identity and a resuming pack's, named option by option
    (the options as ``shardio.pack`` and its flags name them), old value then new."""
    if not isinstance(old, Mapping):
        return "its journal records no options"

    def flat(identity: Mapping[str, Any]) -> dict[str, Any]:  # {"write": {"level": 3}} -> level
        return {k: v for key, value in identity.items() for k, v in (
            value.items() if key in ("write", "pack") and isinstance(value, Mapping)
            else [(key, value)])}

    was, now = flat(old), flat(new)
    changes = []
    for name in [*now, *(n for n in was if n not in now)]:
        if was.get(name) == now.get(name):
            continue
        if name == "source":
            changes.append("the files in SRC changed since it began (added, removed or modified)")
        elif name == "plan":
            changes.append(f"it was planned by another shardio version (plan {was.get(name)}, "
                           f"now {now.get(name)})")
        else:
            changes.append(f"{name} was {was.get(name)!r}, now {now.get(name)!r}")
    return "; ".join(changes) or "its journal records other options"


def shard_is_intact(path: Path, num_bytes: int, checksum: str) -> bool:
    """Whether the finished shard at ``path`` still has the size and checksum journaled."""
    return path.exists() and path.stat().st_size == num_bytes and (
        file_checksum(path, name_of(checksum)) == checksum)


_SUFFIXES = "|".join(re.escape(s) for s in SHARD_SUFFIX.values())
_SHARDIO_NAME = re.compile(
    rf"shard-\d{{5,}}(?:{_SUFFIXES})(?:-lock)?"  # a shard (an old LMDB writer's lock file)
    rf"|\.shard-\d{{5,}}(?:-[0-9a-f]{{8}}-[0-9a-f]{{8}})?(?:{_SUFFIXES})\.tmp"  # one being built
)


def is_shardio_file(name: str) -> bool:
    """Whether ``name`` is one shardio writes into a dataset (shards, journal, manifest, temps).

    Only exact names at the top of the dataset count: ``--overwrite`` deletes
    what this accepts, so ``shard-archive/2023.rec`` or ``shard-old.rec``, which
    a pack never writes, are someone else's.
    """
    return name in (
        MANIFEST_NAME,
        JOURNAL_NAME,
        f".{MANIFEST_NAME}.tmp",
        f"{JOURNAL_NAME}.tmp",
    ) or _SHARDIO_NAME.fullmatch(name) is not None


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
        shown = ", ".join(repr(n) for n in foreign[:20])
        more = f" and {len(foreign) - 20} more" if len(foreign) > 20 else ""
        raise OutputExistsError(
            f"{where}: refusing to overwrite an output that holds {len(foreign)} files "
            f"shardio did not write ({shown}{more}); nothing was deleted. Move them away, "
            "or choose another output folder or prefix",
            path=where,
        )
