"""Engines that run a pack's two parallel phases: the walk of SRC and the building of shards.

``shardio.pack`` plans everything itself (samples, shuffle, shard boundaries,
journal, manifest); an engine only runs tasks, and the output is byte-identical
whichever engine runs them. The boundary is one protocol, ``PackEngine``:

* ``scan``: walk SRC with ``shardio.packing.sources.files.scan_source``, passing it a
  ``shardio.packing.scan.WalkPool`` that runs the engine's walk tasks;
* ``build``: run ``shardio.packing.build.build_shard`` for the shard numbers given
  and yield each outcome once its shard is in the output (``PackTarget``);
* ``close``: release what the engine started.

``local`` (``engines/local.py``) runs both on this machine in forked processes;
``dask`` (``engines/dask.py``, its tasks in ``engines/dasktasks.py``) on a Dask
cluster: an existing one at a scheduler address, or a local one sized to this
machine. A second cluster
engine (Ray, …) is one more module here and one line in ``open_engine``.
``dask`` and ``distributed`` are imported only when the dask engine is opened.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from typing import Final, Protocol

from shardio.errors import MissingDependencyError
from shardio.packing.build import ShardJob, ShardOutcome
from shardio.packing.pool import Progress
from shardio.packing.sources.files import PackSource
from shardio.packing.target import PackTarget

ENGINES: Final = ("local", "dask")
DASK_EXTRA: Final = "pip install 'dask[distributed]' (the extra shardio-torch[dask])"

class PackEngine(Protocol):
    """Runs a pack's walk tasks and shard builds; see the module docstring."""

    name: str

    def scan(
        self, src: str | os.PathLike[str], *, imagefolder: bool | None, include: Sequence[str],
        exclude: Sequence[str], follow_symlinks: bool, class_folders: bool = False,
    ) -> PackSource:
        """``shardio.packing.sources.files.scan_source`` of ``src``, its walk run by this engine."""
        ...

    def build(
        self, job: ShardJob, numbers: Sequence[int], target: PackTarget,
        progress: Progress | None,
    ) -> Generator[ShardOutcome, None, None]:
        """Build shards ``numbers`` of ``job``; yield each outcome once its shard is in ``target``.

        Outcomes come in any order. Closing the generator stops the builds in
        flight (as far as the engine can) and leaves no temporary file behind
        that a resume would not remove.
        """
        ...

    def close(self) -> None:
        """Release the processes, clients or clusters the engine started."""
        ...


def open_engine(
    name: str, *, num_workers: int | None = None, scheduler: str | None = None
) -> PackEngine:
    """The engine ``name`` (one of ``ENGINES``); close it when the pack is done.

    Args:
        name: ``"local"`` or ``"dask"``.
        num_workers: local processes; for ``dask`` without ``scheduler``, the
            worker processes of the local cluster (both default to every core).
        scheduler: a Dask scheduler address (``tcp://host:8786``); only for ``dask``.

    Raises:
        ValueError: an unknown engine, or ``scheduler`` without ``dask``.
        MissingDependencyError: ``dask`` without ``dask[distributed]`` installed.
    """
    if name == "local":
        if scheduler is not None:
            raise ValueError(f"scheduler={scheduler!r} is for engine='dask' (--engine dask); "
                             "the local engine runs on this machine")
        from shardio.packing.engines.local import LocalEngine

        return LocalEngine(num_workers)
    if name == "dask":
        try:
            import distributed  # noqa: F401  # only to say what is missing, before any work
        except ImportError as exc:
            raise MissingDependencyError(
                f"engine 'dask' needs dask and distributed, which are not installed ({exc}); "
                f"install them with {DASK_EXTRA}") from exc
        from shardio.packing.engines.dask import DaskEngine

        return DaskEngine(num_workers=num_workers, scheduler=scheduler)
    raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
