"""What a pack has finished: the journal it resumes from and the manifest it ends with.

``shardio.pack`` keeps one ``ShardResult`` per finished shard, keyed by its
number in the plan; shards finish in any order, and the journal lists them in that
order. This module reads them back from the journal (keeping only shards still intact
in the output, ``shardio.packing.target``) and, once every shard is done, turns them into
the manifest: first indices counted in shard order, fields united in shard order,
shards left empty by bad input omitted. It imports nothing that imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from shardio.backends import shard_name
from shardio.errors import EmptySourceError, PackError
from shardio.format.manifest import JOURNAL_NAME, Manifest, ShardInfo, SkippedFile
from shardio.packing.build import ShardJob, ShardResult
from shardio.packing.sources.files import Bad, PackSource
from shardio.packing.target import PackTarget
from shardio.packing.writer import WriteOptions
from shardio.version import __version__


def resumable_shards(job: ShardJob, identity: Mapping[str, Any],
                     target: PackTarget) -> dict[int, ShardResult]:
    """The journaled shards of an interrupted pack that are still intact in ``target``."""
    state = target.open_journal(identity)
    if state is None:
        return {}
    done: dict[int, ShardResult] = {}
    journal = f"{target.url}/{JOURNAL_NAME}"
    try:
        entries = [ShardResult.from_json(entry) for entry in state["shards"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise PackError(f"{journal}: the pack journal is damaged ({exc!r}); "
                        "use --overwrite to pack again", path=journal) from exc
    for result in entries:
        if not 0 <= result.number < len(job.plan) or result.name != shard_name(
                job.backend, result.number):
            continue
        if result.num_samples == 0 or target.is_intact(result.name, result.num_bytes,
                                                       result.checksum):
            done[result.number] = result
    return done


def pack_manifest(
    job: ShardJob, source: PackSource, options: WriteOptions, done: Mapping[int, ShardResult], *,
    input_bytes: int, pack_options: Mapping[str, Any], seed: int, shuffle: bool,
) -> Manifest:
    """The manifest of the finished shards: first indices and fields follow shard order.

    ``input_bytes`` counts the files packed (those left out excluded).
    """
    shards: list[ShardInfo] = []
    fields: dict[str, None] = {}
    skipped: list[Bad] = list(source.bad)
    for number in range(len(job.plan)):
        result = done[number]
        skipped += result.skipped
        if result.num_samples:
            first = shards[-1].first_index + shards[-1].num_samples if shards else 0
            shards.append(ShardInfo(result.name, result.num_samples, first, result.num_bytes,
                                    result.checksum, result.keys_crc32))
            fields.update(dict.fromkeys(result.fields))
    num_samples = sum(s.num_samples for s in shards)
    if num_samples == 0:
        raise EmptySourceError(f"{source.root}: every sample was bad, nothing was packed",
                               path=source.root)
    classes = source.classes
    return Manifest(
        backend=options.backend, codec=options.codec, num_samples=num_samples,
        num_bytes=sum(s.num_bytes for s in shards), fields=tuple(fields), shards=tuple(shards),
        classes=classes,
        class_to_idx=None if classes is None else {c: i for i, c in enumerate(classes)},
        seed=seed, shuffle=shuffle, options={**asdict(options), **pack_options},
        input_bytes=input_bytes,
        skipped=tuple(SkippedFile(str(p), str(r)) for p, r in sorted(skipped)),
        shardio_version=__version__, version=options.version,
    )
