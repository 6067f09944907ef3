"""Which entries under SRC count as files to pack, and which are bad and why.

This module owns the walk over SRC: hidden entries are ignored and counted,
``include``/``exclude`` globs select files, symbolic links are reported or
followed (without loops), and every file that cannot be packed gets a reason
(empty, special, unreadable by its mode, a name that is not UTF-8, a broken or
looping link). It reads directory entries and ``lstat`` results only, never
file contents, knows nothing of samples or ImageFolders (``shardio.packing.sources.files``
builds those), and imports nothing from shardio. The walk goes folder by
folder from a stack, and can stop after a number of entries and hand back the
folders it has not listed (``Walker.walk_some``): that is how ``shardio.packing.scan``
splits SRC into subtrees walked in parallel, whose results add up
(``Walker.add``) to what one walk finds.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Bad = tuple[str, str]
"""``(path relative to the source, reason)`` of one input that was not packed."""

FileEntry = tuple[str, int, int, "str | None"]
"""``(relative POSIX path, size, mtime_ns, reason it is bad or None)``.

The OS path is ``os.path.join(root, rel)`` (as ``scandir`` builds it); it is
not kept, so that a listing made on another machine, or from the absolute
root, names files exactly as a walk of the root as given would.
"""

Folder = tuple[str, str, "frozenset[tuple[int, int]]"]
"""A folder still to list: ``(OS path, relative path + "/" ("" for SRC), (st_dev, st_ino) of
the folders it is in)``; the last is kept only with ``follow_symlinks``, to see loops."""


def display_path(rel: str) -> str:
    """``rel`` made printable: bytes that are not UTF-8 appear as ``\\xNN``."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_utf8(name: str) -> bool:
    """Whether a name read from the OS is valid UTF-8 (not bytes kept as surrogate escapes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def selector(include: Sequence[str], exclude: Sequence[str]) -> Callable[[str], bool] | None:
    """A test of a relative POSIX path against ``include``/``exclude`` globs; None keeps all."""
    if not include and not exclude:
        return None
    inc = re.compile("|".join(fnmatch.translate(g) for g in include)) if include else None
    exc = re.compile("|".join(fnmatch.translate(g) for g in exclude)) if exclude else None
    return lambda rel: (inc is None or inc.match(rel) is not None) and (
        exc is None or exc.match(rel) is None
    )


_SPECIAL = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


@dataclass(frozen=True)
class WalkPart:
    """What the walk of some folders found, without the callables (it crosses processes)."""

    files: list[FileEntry]
    bad_dirs: list[Bad]
    top_dirs: list[str]
    top_other: int
    hidden: int
    excluded: int
    entries: int
    pending: list[Folder]
    """Folders found but not listed yet: the rest of the subtrees."""


class Walker:
    """A ``scandir`` walk: ``files``, ``bad_dirs``, top-level entries and counts.

    Call ``walk(root, "", frozenset())`` once; ``files`` then holds every file
    that counts as a ``FileEntry``, in no particular order (``shardio.packing.sources.files``
    sorts). ``walk_some`` walks part of a tree and returns the rest.
    """

    def __init__(
        self, root: str, select: Callable[[str], bool] | None, follow_symlinks: bool
    ) -> None:
        self.root = root
        self.select = select
        self.follow = follow_symlinks
        self.files: list[FileEntry] = []
        self.bad_dirs: list[Bad] = []
        self.top_dirs: list[str] = []
        self.top_other = 0
        self.hidden = 0
        self.excluded = 0
        self.entries = 0
        """Folders listed plus the entries in them (hidden ones included): the walk's work."""
        self.euid = os.geteuid() if hasattr(os, "geteuid") else 0
        self.groups = set(os.getgroups()) | {os.getegid()} if self.euid else set()
        self._todo: list[Folder] = []

    def walk(self, path: str, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        """Collect everything under folder ``path`` (``rel`` is its relative path + "/")."""
        self.walk_some([(path, rel, ancestors)], None)

    def walk_some(self, folders: Sequence[Folder], max_entries: int | None) -> list[Folder]:
        """List ``folders`` and the folders found in them until ``max_entries`` entries were seen.

        A folder is always listed whole; the walk stops between folders.

        Returns:
            The folders found but not listed (empty once the subtrees are done).
        """
        todo = self._todo = list(reversed(folders))
        stop = self.entries + max_entries if max_entries is not None else None
        while todo and (stop is None or self.entries < stop):
            self._list(*todo.pop())
        return todo[::-1]

    def part(self, pending: list[Folder]) -> WalkPart:
        """What this walker found, to send to the walker of the whole tree (``add``)."""
        return WalkPart(self.files, self.bad_dirs, self.top_dirs, self.top_other, self.hidden,
                        self.excluded, self.entries, pending)

    def add(self, part: WalkPart) -> None:
        """Take in what a walker of other folders of the same tree found."""
        self.files += part.files
        self.bad_dirs += part.bad_dirs
        self.top_dirs += part.top_dirs
        self.top_other += part.top_other
        self.hidden += part.hidden
        self.excluded += part.excluded
        self.entries += part.entries

    def _list(self, path: str, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        """Sort the entries of one folder; push its sub-folders onto the stack."""
        try:
            if not rel and self.follow:  # SRC is its own first ancestor, found where it is listed
                st = os.stat(path)
                ancestors = ancestors | {(st.st_dev, st.st_ino)}
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as exc:
            reason = f"folder cannot be read ({exc.strerror})"
            self.bad_dirs.append((display_path(rel or "."), reason))
            return
        self.entries += len(entries) + 1  # a folder counts too: a tree of empty ones ends
        select, files, fast = self.select, self.files, bool(rel) and not self.euid
        for entry in entries:
            name = entry.name
            if name[0] == ".":
                self.hidden += 1
                continue
            erel = rel + name
            try:
                if not name.isascii() and not is_utf8(name):
                    folder = entry.is_dir(follow_symlinks=False)
                    self._bad(erel, "folder name is not valid UTF-8; rename it (e.g. with "
                              "`convmv`); nothing inside it was packed" if folder else
                              "name is not valid UTF-8; rename it (e.g. with `convmv`)", folder)
                elif entry.is_dir(follow_symlinks=False):
                    self._enter(entry.path, erel, ancestors, entry)
                elif entry.is_symlink():
                    self._symlink(entry.path, erel, ancestors)
                elif select is None or select(erel):
                    st = entry.stat(follow_symlinks=False)
                    if fast and st.st_size and stat.S_ISREG(st.st_mode):
                        files.append((erel, st.st_size, st.st_mtime_ns, None))
                    else:
                        self._add(erel, st)
                else:
                    self.excluded += 1
            except OSError as exc:
                self._bad(erel, f"cannot be examined ({exc.strerror})")

    def _enter(
        self, path: str, rel: str, ancestors: frozenset[tuple[int, int]], entry: Any = None
    ) -> None:
        if self.follow:
            st = entry.stat(follow_symlinks=False) if entry is not None else os.stat(path)
            ancestors = ancestors | {(st.st_dev, st.st_ino)}
        if "/" not in rel:
            self.top_dirs.append(rel)
        self._todo.append((path, rel + "/", ancestors))

    def _bad(self, rel: str, reason: str, folder: bool = False) -> None:
        if folder:
            self.bad_dirs.append((display_path(rel) + "/", reason))
        elif self.select is None or self.select(rel):
            self.files.append((rel, 0, 0, reason))
        else:
            self.excluded += 1
            return
        if "/" not in rel:
            self.top_other += 1

    def _symlink(self, path: str, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        target = display_path(os.readlink(path))
        try:
            st = os.stat(path)
        except OSError as exc:
            what = {errno.ELOOP: "symbolic link loop", errno.ENOENT: "broken symbolic link"}
            self._bad(rel, f"{what.get(exc.errno or 0, 'symbolic link cannot be followed')}"
                                 f" (-> {target}: {exc.strerror})")
            return
        folder = stat.S_ISDIR(st.st_mode)
        if not self.follow:
            self._bad(rel, f"symbolic link to a {'folder' if folder else 'file'} (-> "
                      f"{target}); links are not followed by default: pass --follow-symlinks "
                      "to pack what it points to", folder)
        elif folder and (st.st_dev, st.st_ino) in ancestors:
            self._bad(rel, f"symbolic link loop (-> {target} is one of its own parents)",
                      True)
        elif folder:
            self._enter(path, rel, ancestors)
        elif self.select is None or self.select(rel):
            self._add(rel, st)
        else:
            self.excluded += 1

    def _add(self, rel: str, st: os.stat_result) -> None:
        reason = self.verdict(st)
        if "/" not in rel:
            self.top_other += 1
        self.files.append((rel, st.st_size if reason is None else 0, st.st_mtime_ns, reason))

    def verdict(self, st: os.stat_result) -> str | None:
        """Why a file with this ``stat`` cannot be packed, or None when it can."""
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            return f"{_SPECIAL.get(stat.S_IFMT(mode), 'a special file')}, not a regular file"
        if st.st_size == 0:
            return "empty file (0 bytes)"
        if self.euid and not self._readable(st):
            return f"permission denied (mode {stat.filemode(mode)}); make it readable"
        return None

    def _readable(self, st: os.stat_result) -> bool:
        if st.st_uid == self.euid:
            return bool(st.st_mode & stat.S_IRUSR)
        if st.st_gid in self.groups:
            return bool(st.st_mode & stat.S_IRGRP)
        return bool(st.st_mode & stat.S_IROTH)
