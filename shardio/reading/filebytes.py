"""A sample's ``bytes`` value that knows where in a mapped shard file it was read.

Through a plain ``torch.utils.data.DataLoader`` with workers (what most users keep),
each batch a worker's collate returns is pickled into a pipe and unpickled in the
main process: an 80 KB image crossed as its bytes, copied into the pickle, through
the pipe's 64 KB buffer in pieces, and out again, on the cores the main process
shares. That made 2 workers about a fifth as fast as one process on the images
(``benchmarks/README.md``). A ``FileBytes`` is an ordinary ``bytes`` to the
collate and to user code; only when ``multiprocessing`` pickles it for another
process on this machine (its ``ForkingPickler``, which DataLoader queues use) does
it cross as the shard file, offset and length it was read from, and the main
process reads it from that file (``shardio.torch.handover.ring`` registers the reduction,
``shardio.torch.handover.views`` rebuilds it). Any other pickling (``pickle``,
``copy``) gives a plain ``bytes``. Torch-free.
"""

from __future__ import annotations

from typing import Any


class FileBytes(bytes):
    """``bytes`` read from a local shard map, with the map and the offset it was read at."""

    source: Any
    """The ``mmap.mmap`` of the shard file the value was copied out of."""
    offset: int
    """Where the value starts in ``source``."""

    def __reduce__(self) -> tuple[type[bytes], tuple[bytes]]:
        return bytes, (bytes(self),)


def file_bytes(value: memoryview, source: Any, offset: int) -> FileBytes:
    """``value`` (a view of ``source`` at ``offset``) copied into a ``FileBytes``."""
    out = FileBytes(value)
    out.source, out.offset = source, offset
    return out
