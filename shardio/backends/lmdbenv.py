"""One read-only LMDB environment per shard file per process, shared by its readers.

py-lmdb refuses to open a file that this process already has open ("already
open in this process": liblmdb's locks belong to the process and file, so a
second environment would share and then release the first one's). Two readers
of one shard in a process — an ``IndexedDataset`` beside a ``StreamingDataset``,
``shardio cat`` while a dataset is open — therefore share one environment from
a process-wide registry, counted by reference: the last ``release_env`` closes
it. The registry is keyed, as py-lmdb keys its refusal, by the file's
``(st_dev, st_ino)``: a hard link or symlink to an open shard shares its
environment, and a file replaced on disk (a re-pack to the same path) is a new
inode with an environment of its own, while readers of the old file keep
theirs. While an environment is open its file descriptor keeps the inode
allocated, so the number is never reused under it.

A forked child starts with an empty registry (``os.register_at_fork``) and
never uses, or calls ``close`` on, an environment of its parent: liblmdb
forbids using one across ``fork``. py-lmdb errors met while opening are translated here into
messages that say what happened; only the kinds that mean a bad file call the
shard damaged. Imports only ``errors`` from shardio.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import lmdb

from shardio.errors import (
    ShardCorruptError,
    ShardioError,
    ShardMissingError,
    UnsupportedVersionError,
)

REPACK: Final = "the shard is damaged: restore it from a copy or re-pack"
MAX_OPEN_ATTEMPTS: Final = 3
"""Opens tried while the file at a path keeps being replaced before giving up."""

FileId = tuple[int, int, str]
"""``(st_dev, st_ino, "")``; the real path instead where a filesystem has no inode numbers."""

_DAMAGE: Final = (
    lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.IncompatibleError,
    lmdb.BadChecksumError,
)
"""py-lmdb errors at open that mean the file's bytes are wrong, not the process's situation."""


@dataclass(eq=False)
class SharedEnv:
    """One open environment and how many readers of this process hold it."""

    env: lmdb.Environment
    file_id: FileId
    pid: int
    refs: int = 0


_envs: dict[FileId, SharedEnv] = {}
_lock = threading.Lock()
_pid = os.getpid()


def _forget_after_fork() -> None:
    """In a forked child: start with no environments; the parent's are never used here.

    Once their readers let go too (``LmdbShardReader`` has its own hook), py-lmdb
    finalizes the inherited environments and forgets their files, so the child
    can open them afresh. Its finalizer does not abort their transactions in a
    child; closing a lock-free read-only environment only unmaps this process's
    copy of the file and closes this process's descriptor, which the parent
    never sees. Kept referenced instead, they would bar the child from the files.
    """
    global _envs, _lock, _pid
    _lock = threading.Lock()  # another thread may have held it at fork time
    _envs = {}
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def translate_error(
    exc: lmdb.Error, path: str, doing: str, record: int | None = None
) -> ShardioError:
    """The shardio error for an LMDB error met while ``doing`` something to ``path``."""
    where = path if record is None else f"{path}: record {record}"
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, lmdb.VersionMismatchError):
        return UnsupportedVersionError(
            f"{where}: {doing} failed: written by an incompatible LMDB version ({detail}); "
            "re-pack it with this shardio",
            path=path, record=record,
        )
    if isinstance(exc, lmdb.InvalidError):
        detail = f"not an LMDB file: {detail}"
    return ShardCorruptError(
        f"{where}: {doing} failed ({detail}); {REPACK}", path=path, record=record
    )


def _os_errno(exc: lmdb.Error) -> int | None:
    """The errno of an OS failure, which py-lmdb reports only as text ``"<path>: <strerror>"``."""
    text = str(exc)
    for code in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE,
                 errno.ENOMEM):
        if text.endswith(": " + os.strerror(code)):
            return code
    return None


def open_error(exc: lmdb.Error, path: str, size: int) -> ShardioError:
    """The shardio error for ``exc`` from ``lmdb.open`` of the checked ``size``-byte file."""
    if isinstance(exc, (lmdb.VersionMismatchError, *_DAMAGE)):
        return translate_error(exc, path, "opening the shard")
    detail = f"{type(exc).__name__}: {exc}"
    code = _os_errno(exc)
    sound = "the file is not damaged"
    if "already open in this process" in str(exc):
        # every shardio reader shares the registry's environment, so another one is not ours
        return ShardioError(
            f"{path}: cannot open the LMDB shard: this process already holds the file open "
            "through an lmdb environment shardio does not manage (opened by other code, or "
            "inherited across fork and still referenced), and py-lmdb allows one per file "
            f"per process ({detail}). {sound}: close that environment first, or read the "
            "shard through shardio only",
            path=path,
        )
    if code == errno.ENOENT:
        return ShardMissingError(
            f"{path}: the shard file disappeared while it was being opened ({detail}); "
            "restore the file, or re-pack the dataset",
            path=path,
        )
    if code in (errno.EMFILE, errno.ENFILE):
        return ShardioError(
            f"{path}: cannot open the LMDB shard: too many open files ({detail}); {sound}: "
            "raise the limit (ulimit -n) or keep fewer shards open at once",
            path=path,
        )
    if code == errno.ENOMEM or isinstance(exc, lmdb.MemoryError):
        return ShardioError(
            f"{path}: cannot map the {size}-byte LMDB shard: out of memory or address space "
            f"({detail}); {sound}: raise the address-space limit (ulimit -v) or keep fewer "
            "shards open at once",
            path=path,
        )
    if code in (errno.EACCES, errno.EPERM) or isinstance(exc, lmdb.ReadonlyError):
        return ShardioError(
            f"{path}: cannot open the LMDB shard: permission denied ({detail}); make the file "
            "readable by this user",
            path=path,
        )
    return ShardioError(
        f"{path}: opening the LMDB shard failed ({detail}); its structure was checked and is "
        "sound, so this is a failure of the environment, not damage in the file",
        path=path,
    )


def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError as exc:
        raise ShardMissingError(
            f"{path}: shard file is missing; the dataset is incomplete. Restore the file, or "
            "re-pack the dataset",
            path=path,
        ) from exc


def _file_id(path: str, st: os.stat_result) -> FileId:
    if st.st_ino:
        return (st.st_dev, st.st_ino, "")
    return (st.st_dev, 0, os.path.normcase(os.path.realpath(path)))


def acquire_env(path: str, *, check: Callable[[str], object]) -> tuple[SharedEnv, int]:
    """The environment of the file now at ``path``, with one more reference held.

    Args:
        path: an LMDB shard file.
        check: proves a file sound before this process first maps it
            (``lmdbcheck.check_lmdb_file``): liblmdb follows page numbers unchecked,
            and a damaged one can send it past the end of the file (SIGBUS). Later
            readers of the same file share what was checked.

    Returns:
        The shared environment (give it back with ``release_env``) and the file's size.

    Raises:
        ShardMissingError: no file at ``path``.
        ShardCorruptError: the file is not a sound LMDB file.
        ShardioError: the file cannot be opened here; the message says why.
    """
    if _pid != os.getpid():  # forked, and another at-fork hook got here before ours
        _forget_after_fork()
    for _attempt in range(MAX_OPEN_ATTEMPTS):
        st = _stat(path)
        file_id = _file_id(path, st)
        with _lock:
            shared = _envs.get(file_id)
            if shared is not None:
                shared.refs += 1
                return shared, st.st_size
        check(path)  # outside the lock: it reads the file, and opens of other files wait
        with _lock:
            shared = _envs.get(file_id)
            if shared is None:
                try:
                    env = lmdb.open(
                        path, subdir=False, readonly=True, lock=False, create=False,
                        max_spare_txns=0,
                    )
                except lmdb.Error as exc:
                    raise open_error(exc, path, st.st_size) from exc
                # the check and the open each opened the path anew: both saw the file of
                # file_id only if the path still names it (else it was replaced meanwhile)
                try:
                    now = _file_id(path, os.stat(path))
                except FileNotFoundError:
                    now = None
                if now != file_id:
                    env.close()
                    continue
                shared = _envs[file_id] = SharedEnv(env, file_id, os.getpid())
            shared.refs += 1
            return shared, st.st_size
    raise ShardioError(
        f"{path}: the file was replaced {MAX_OPEN_ATTEMPTS} times while being opened; let "
        "whatever rewrites it (a pack with --overwrite?) finish, then open it again",
        path=path,
    )


def release_env(shared: SharedEnv) -> None:
    """Give back one reference; the last one closes the environment.

    In a forked child an inherited environment is left alone: closing it is
    liblmdb's business in the process that opened it.
    """
    if shared.pid != os.getpid():
        return
    with _lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        if _envs.get(shared.file_id) is shared:
            del _envs[shared.file_id]
        # closed under the lock: an open of the same file meanwhile would find no entry and
        # be refused by py-lmdb while this environment still exists
        shared.env.close()
