"""The walk of SRC split into subtrees that run as tasks, in parallel, on any engine.

Listing and stat-ing millions of files is itself a bottleneck of a pack, so the
walk (``shardio.walk``) runs as tasks: ``walk_part`` lists folders depth first
until it has seen ``max_entries`` entries and returns what it found plus the
folders it did not reach. ``walk_tree`` (in the packing process) walks the
first ``max_entries`` itself, so a small tree never starts a task, then hands
the folders left over to the pool's idle slots as new tasks, and so on until
none are left. A tree of any shape thus becomes tasks of about ``max_entries``
entries each, and the sum of the parts is what one serial walk finds whatever
the split: ``shardio.source`` sorts everything it takes from the listing.
Where tasks run is the engine's business (``WalkPool``: forked processes or
threads on this machine, Dask workers on a cluster). A single folder is listed
by one task, however large. Imports only ``walk`` from shardio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from shardio.walk import Folder, Walker, WalkPart, selector

MAX_ENTRIES: Final = 4096
"""Entries one local task walks before it hands back the rest (a few ms of ``scandir``)."""


@dataclass(frozen=True)
class WalkSpec:
    """What a walk task needs besides its folders; small and picklable."""

    root: str
    """SRC as the task sees it: the path walked (absolute when tasks run elsewhere)."""
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = False


def walk_part(spec: WalkSpec, folders: Sequence[Folder], max_entries: int | None) -> WalkPart:
    """One walk task: list ``folders`` and below until ``max_entries`` entries were seen."""
    walker = Walker(spec.root, selector(spec.include, spec.exclude), spec.follow_symlinks)
    pending = walker.walk_some(folders, max_entries)
    return walker.part(pending)


class WalkPool(Protocol):
    """Runs ``walk_part(spec, folders, max_entries)`` tasks."""

    slots: int
    """How many tasks run at once."""
    max_entries: int
    """The budget of each task."""

    def submit(self, spec: WalkSpec, folders: list[Folder]) -> None:
        """Start a task walking ``folders`` of ``spec``."""
        ...

    def next_done(self) -> WalkPart:
        """Wait for any started task to finish and return its part (or raise its error)."""
        ...


def split_folders(folders: list[Folder], ways: int) -> list[list[Folder]]:
    """``folders`` dealt round-robin into at most ``ways`` non-empty batches.

    The folders come from a depth-first stack, so neighbours tend to be of one
    subtree; dealing them out mixes big and small subtrees in every batch.
    """
    ways = max(1, min(ways, len(folders)))
    return [folders[i::ways] for i in range(ways)]


def walk_tree(spec: WalkSpec, into: Walker, pool: WalkPool | None) -> None:
    """Walk all of ``spec.root`` and add everything found to ``into``.

    The first ``pool.max_entries`` entries are walked here; the rest, if any,
    by ``pool``'s tasks. Without a pool everything is walked here.
    """
    here = Walker(spec.root, into.select, spec.follow_symlinks)
    start: list[Folder] = [(spec.root, "", frozenset())]
    pending = here.walk_some(start, None if pool is None else pool.max_entries)
    into.add(here.part([]))
    running = 0
    while True:
        if pending:
            assert pool is not None
            for batch in split_folders(pending, pool.slots - running):
                pool.submit(spec, batch)
                running += 1
        if not running:
            return
        assert pool is not None
        part = pool.next_done()
        running -= 1
        into.add(part)
        pending = part.pending
