"""This process's rank and world size as a launcher's environment gives them.

``torchrun`` (and ``torch.distributed.launch``, Lightning, Accelerate, most
cluster wrappers) export ``RANK`` and ``WORLD_SIZE`` to every process before
``torch.distributed`` is initialised, so a dataset made before
``init_process_group`` (or in a job that never calls it) still splits the
data right. The split needs only the global rank: ranks of one node share
the node's cache through its folder, not through ``LOCAL_RANK``. A half-set
or inconsistent environment is an error, never a silent ``(0, 1)``: every
rank would then read the whole dataset. Imports nothing from shardio or torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def _int_var(environ: Mapping[str, str], name: str) -> int:
    text = environ[name]
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={text!r} is not an integer; a launcher such as "
            "torchrun sets RANK and WORLD_SIZE to integers. Fix or unset it, or pass "
            "rank= and world_size= explicitly"
        ) from None


def env_rank(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` from the environment, or None when neither is set.

    Args:
        environ: the variables to read; ``os.environ`` by default.

    Raises:
        ValueError: only one of them is set, one is not an integer, or
            ``RANK`` is not in ``0 .. WORLD_SIZE - 1``.
    """
    env = os.environ if environ is None else environ
    has_rank, has_world = "RANK" in env, "WORLD_SIZE" in env
    if not has_rank and not has_world:
        return None
    if not (has_rank and has_world):
        given, missing = ("RANK", "WORLD_SIZE") if has_rank else ("WORLD_SIZE", "RANK")
        raise ValueError(
            f"environment variable {given}={env[given]!r} is set but {missing} is not; a "
            "launcher such as torchrun sets both. Set both, unset it, or pass rank= and "
            "world_size= explicitly"
        )
    rank, world_size = _int_var(env, "RANK"), _int_var(env, "WORLD_SIZE")
    return check_rank(rank, world_size,
                      f"environment variables RANK={rank} and WORLD_SIZE={world_size}",
                      "Fix them, or pass rank= and world_size= explicitly")


def check_rank(rank: int, world_size: int, given: str, fix: str) -> tuple[int, int]:
    """``(rank, world_size)`` when ``rank`` is one of ``world_size`` ranks, wherever they
    came from: a split outside them would fail only later, at ``len()`` or the first sample.

    Raises:
        ValueError: ``rank`` is not in ``0 .. world_size - 1``; the message names what
            gave them (``given``) and says how to ``fix`` it.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"{given} do not fit: the rank must be in 0 .. world size - 1. {fix}")
    return rank, world_size
