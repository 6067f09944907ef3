"""Page-locked host memory for the batches a DataLoader pins, one buffer a batch.

With ``pin_memory`` the DataLoader's thread pins each tensor of a batch on its own:
a copy per tensor, so a batch of images of several sizes (a list of views of one
buffer) became one pinned allocation and one copy per image, and the views no
longer shared a buffer. Where pinning is on, ``shardio.loader`` instead builds a
batch's tensors over one pinned buffer (a worker's slot copied once, or a batch
decoded into it in this process); the DataLoader's thread then finds them pinned
and leaves them as they are. Imports torch.
"""

from __future__ import annotations

import torch


def enabled(pin_memory: bool | None) -> bool:
    """Whether a loader's batches are pinned: asked for (default: with CUDA) and CUDA present.

    A DataLoader asked to pin without an accelerator only warns and pins nothing.
    """
    return (pin_memory is None or pin_memory) and torch.cuda.is_available()


def empty(nbytes: int) -> torch.Tensor:
    """``nbytes`` of page-locked uint8 memory from torch's caching host allocator."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
