"""``ShardWriter``: samples in, shards and a manifest out, crash-safe.

Samples are written in the order given. Each shard is written under a hidden
temporary name, fsynced and renamed when it rolls (at ``max_shard_bytes`` or
``max_shard_samples``); after every finished shard a small journal
(``.shardio-pack.json``) records what is done, so an interrupted pack can
resume. ``manifest.json`` is written last and atomically, on a clean exit only:
an exception, Ctrl-C or ``kill -9`` never leaves a manifest that points at a
missing or partial shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from numbers import Integral
from pathlib import Path
from types import TracebackType
from typing import Any, Final, cast

from shardio.backends import (
    SHARD_SUFFIX,
    ShardFileWriter,
    create_shard,
    open_shard,
    shard_name,
)
from shardio.errors import RecordEncodeError
from shardio.format.blockfile import block_records_for, record_bytes
from shardio.format.codecs import get_codec
from shardio.format.frames import FORMAT_VERSION, SUPPORTED_VERSIONS
from shardio.format.manifest import (
    JOURNAL_NAME as JOURNAL_NAME,  # where callers have always found it
)
from shardio.format.manifest import (
    Manifest,
    ShardInfo,
    SkippedFile,
    fsync_dir,
)
from shardio.format.record import INDEX_FIELD, KEY_FIELD, SOURCE_FIELD, encode_record
from shardio.packing.target import PackTarget, open_target
from shardio.packing.target import prepare_output as prepare_output  # where pack found it
from shardio.storage import RemoteOptions, is_remote
from shardio.version import __version__

DEFAULT_MAX_SHARD_BYTES: Final = 256 * 1000 * 1000


@dataclass(frozen=True)
class WriteOptions:
    """How samples become shards; also the identity a resumed pack must match."""

    backend: str = "records"
    codec: str = "zstd"
    level: int = 3
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    max_shard_samples: int | None = None
    version: int = FORMAT_VERSION
    """The format version shards are written in (docs/format.md)."""
    block_records: int | None = None
    """v3: records a block, the same in every shard, so that a reading plan's blocks are
    whole blocks; None: chosen from the first samples (``shardfile3.block_records_for``)."""

    def __post_init__(self) -> None:
        if self.backend not in SHARD_SUFFIX:
            raise ValueError(f"backend must be one of {sorted(SHARD_SUFFIX)}, got {self.backend!r}")
        get_codec(self.codec, self.level)
        if self.max_shard_bytes <= 0:
            raise ValueError(f"max_shard_bytes must be positive, got {self.max_shard_bytes}")
        if self.version not in SUPPORTED_VERSIONS:
            raise ValueError(f"version must be one of {sorted(SUPPORTED_VERSIONS)}, got "
                             f"{self.version!r}")
        if self.block_records is not None and self.block_records <= 0:
            raise ValueError(f"block_records must be positive, got {self.block_records}")
        if self.max_shard_samples is not None and self.max_shard_samples <= 0:
            raise ValueError(f"max_shard_samples must be positive, got {self.max_shard_samples}")


LABELLED_FIELDS: Final = frozenset({KEY_FIELD, "image", "label"})
"""The fields of every sample of a labelled (ImageFolder) dataset: what its readers require."""


def _check_labelled(sample: Mapping[str, Any], key: str, classes: Sequence[str]) -> None:
    """Refuse a sample a labelled dataset's readers could not read."""
    expected = (f"exactly {{'__key__', 'image': bytes, 'label': int in 0..{len(classes) - 1}}}"
                if classes else "no samples at all (classes is empty)")
    found = sorted(sample)
    if set(found) != LABELLED_FIELDS:
        raise RecordEncodeError(
            f"sample {key!r}: a dataset with classes takes {expected}; found fields {found}. "
            "Rename the fields, or write without classes for a generic dataset"
        )
    image, label = sample["image"], sample["label"]
    if not isinstance(image, (bytes, bytearray, memoryview)):
        raise RecordEncodeError(
            f"sample {key!r}: a dataset with classes takes {expected}; found image of type "
            f"{type(image).__name__}. Store the encoded image file's bytes"
        )
    if isinstance(label, bool) or not isinstance(label, Integral) or not (
        0 <= int(label) < len(classes)
    ):
        raise RecordEncodeError(
            f"sample {key!r}: a dataset with classes takes {expected}; found label {label!r} "
            f"({type(label).__name__}). Use the class's index in classes"
        )


class ShardWriter:
    """Write samples into shards with a manifest; use as a context manager.

    Example::

        from shardio import ShardWriter, WriteOptions

        with ShardWriter("out/", WriteOptions(max_shard_samples=1000)) as writer:
            writer.write({"__key__": "a/0001", "jpg": b"<jpeg bytes>", "cls": 3})

    With ``classes`` the dataset is labelled (what ``shardio pack`` makes of an
    ImageFolder) and every sample must be exactly ``{"__key__", "image": bytes,
    "label": int}`` with the label an index into ``classes``::

        from shardio import ShardWriter

        with ShardWriter("labelled/", classes=["cat", "dog"]) as writer:
            writer.write({"__key__": "dog/0001.jpg", "image": b"<jpeg bytes>", "label": 1})
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        options: WriteOptions | None = None,
        *,
        classes: Sequence[str] | None = None,
        overwrite: bool = False,
        resume: bool = False,
        identity: Mapping[str, Any] | None = None,
        max_shard_samples: int | None = None,
        max_shard_bytes: int | None = None,
        backend: str | None = None,
        codec: str | None = None,
        version: int | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        """Open ``out`` for writing.

        Args:
            out: dataset folder; created if absent, must be empty unless ``overwrite``.
                A URL (``s3://bucket/prefix``…) works too: each shard is built in a
                local staging folder and uploaded when it rolls, the manifest last
                (``shardio.packing.target``); resuming one downloads its shards' keys.
            options: backend, codec and shard size limits; or give them as the
                keywords below (the WebDataset / MosaicML habit), not both.
            classes: for labelled data, the class names; ``class_to_idx`` follows their order.
            overwrite: replace an existing shardio dataset in ``out``.
            resume: keep the shards an interrupted writer with the same ``identity``
                finished; the caller then skips the first ``num_resumed`` samples.
            identity: what must be equal for a resume to be valid (pack options, seed…).
            max_shard_samples: roll to a new shard after this many samples.
            max_shard_bytes: roll to a new shard before it would pass this size.
            backend: ``"records"`` or ``"lmdb"``.
            codec: ``"zstd"`` or ``"none"``.
            version: the format version (default: this release's; 2 writes what older
                shardio reads).
            remote: how a URL ``out`` is reached (``RemoteOptions``); only its
                ``storage_options`` and ``retry`` matter when writing. Ignored for a
                local ``out``.

        Raises:
            TypeError: both ``options`` and one of the keywords above were given.
        """
        given: dict[str, Any] = {name: value for name, value in (
            ("max_shard_samples", max_shard_samples), ("max_shard_bytes", max_shard_bytes),
            ("backend", backend), ("codec", codec), ("version", version)) if value is not None}
        if options is not None and given:
            raise TypeError(
                f"ShardWriter got both options= and {', '.join(f'{k}=' for k in given)}; "
                "pass the settings either as a WriteOptions or as keywords, not both"
            )
        self.out: Path | str = os.fspath(out) if is_remote(out) else Path(out)
        self.options = options or WriteOptions(**given)
        self.classes = None if classes is None else tuple(classes)
        self._codec = get_codec(self.options.codec, self.options.level)
        self._identity = {"write": asdict(self.options), **dict(identity or {})}
        self._shards: list[ShardInfo] = []
        self._journaled: list[dict[str, Any]] = []
        self._fields: dict[str, None] = {}
        self._keys: set[str] = set()
        self._current: ShardFileWriter | None = None
        self._current_tmp: Path | None = None
        self._current_keys: list[str] = []
        self._current_count = 0
        self._current_bytes = 0
        self._num_samples = 0
        self._closed = False
        self.info: dict[str, Any] = {}
        self._target: PackTarget = open_target(out, remote)
        try:
            self._target.prepare(overwrite=overwrite, resume=resume)
            if resume:
                self._load_journal()
        except BaseException:
            self._target.close()
            raise
        self.num_resumed = self._num_samples

    def _load_journal(self) -> None:
        state = self._target.open_journal(self._identity)
        if state is None:
            return
        for entry in state["shards"]:
            info = ShardInfo(**entry)
            if not self._target.is_intact(info.name, info.num_bytes, info.checksum):
                break
            with self._target.local_copy(info.name) as path:
                reader = open_shard(self.options.backend, path)
                try:
                    self._keys.update(reader.keys())
                finally:
                    reader.close()
            self._shards.append(info)
            self._num_samples += info.num_samples
        self._fields = dict.fromkeys(state.get("fields", []))
        chosen = state.get("block_records")
        if self._shards and self.options.block_records is None and type(chosen) is int:
            # what the first writer chose from its first sample: every shard's blocks alike
            self.options = replace(self.options, block_records=chosen)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    @property
    def num_samples(self) -> int:
        """Samples written so far, resumed ones included."""
        return self._num_samples

    def write(self, sample: Mapping[str, Any]) -> None:
        """Encode and append one sample; its ``__key__`` must be a unique str.

        Raises:
            RecordEncodeError: the key is missing, empty or taken; a field is
                reserved or holds what records cannot store; or, with
                ``classes``, the sample is not ``{__key__, image, label}``.
        """
        key = sample.get(KEY_FIELD)
        if not isinstance(key, str) or not key:
            raise RecordEncodeError(
                f"every sample needs a non-empty str {KEY_FIELD!r}, got {key!r}"
            )
        for name, set_to in ((INDEX_FIELD, "the sample's position"),
                             (SOURCE_FIELD, "the sample's source in a mixture")):
            if name in sample:
                raise RecordEncodeError(
                    f"sample {key!r}: field {name!r} is reserved (readers set it to {set_to}); "
                    "rename the field"
                )
        if self.classes is not None:
            _check_labelled(sample, key, self.classes)
        if self.options.version >= 3:
            try:
                size = record_bytes(sample)
            except RecordEncodeError as exc:
                raise RecordEncodeError(f"sample {key!r}: {exc}") from exc
            if self.options.block_records is None:  # the first sample's size sets it
                self.options = replace(self.options, block_records=block_records_for(size))
            self._put(key, sample.keys(), size, lambda shard: shard.add(sample))
        else:
            self._write_encoded(key, encode_record(sample, self._codec), sample.keys())

    def _write_encoded(self, key: str, framed: bytes, fields: Iterable[str]) -> None:
        """Append a record framed by ``encode_record`` from a sample whose key and fields these are.

        Private: the record's own ``__key__`` and field names must be ``key``
        and ``fields``, or the key block and manifest would describe records
        that are not there (``unpack`` and every reader rely on them agreeing).
        """
        self._put(key, fields, len(framed),
                  lambda shard: cast(Any, shard).append(key, framed))

    def _put(self, key: str, fields: Iterable[str], size: int,
             add: Callable[[ShardFileWriter], None]) -> None:
        """Add a record of ``size`` stored bytes (about) to the open shard with ``add``."""
        if self._closed:
            raise ValueError("ShardWriter is closed")
        if key in self._keys:
            raise RecordEncodeError(f"duplicate sample key {key!r}: keys must be unique")
        self._keys.add(key)
        for name in fields:
            if name != KEY_FIELD and name not in self._fields:
                self._fields[name] = None
        opts = self.options
        if self._current is not None and (
            self._current_bytes + size > opts.max_shard_bytes
            or (
                opts.max_shard_samples is not None and self._current_count >= opts.max_shard_samples
            )
        ):
            self._finish_shard()
        if self._current is None:
            name = shard_name(opts.backend, len(self._shards))
            self._current_tmp = self._target.staging / f".{name}.tmp"
            self._current = create_shard(opts.backend, self._current_tmp, version=opts.version,
                                         codec=opts.codec, level=opts.level,
                                         block_records=opts.block_records)
        add(self._current)
        self._current_keys.append(key)
        self._current_count += 1
        self._current_bytes += size
        self._num_samples += 1

    def _finish_shard(self) -> None:
        assert self._current is not None and self._current_tmp is not None
        size, checksum = self._current.finish()
        name = shard_name(self.options.backend, len(self._shards))
        os.replace(self._current_tmp, self._target.staging / name)
        first = self._shards[-1].first_index + self._shards[-1].num_samples if self._shards else 0
        self._shards.append(ShardInfo(name, self._current_count, first, size, checksum,
                                      self._current.keys_crc32))
        self._current = None
        self._current_tmp = None
        self._current_keys = []
        self._current_count = 0
        self._current_bytes = 0
        fsync_dir(self._target.staging)
        self._target.publish(name)
        self._write_journal()

    def _write_journal(self) -> None:
        journaled = self._journaled  # grows with the shards: one line more each
        journaled += [asdict(s) for s in self._shards[len(journaled):]]
        self._target.write_journal({
            "identity": self._identity,
            "fields": list(self._fields),
            "shards": journaled,
            "block_records": self.options.block_records,
        })

    def close(self) -> Manifest:
        """Finish the last shard and write the manifest; returns it.

        If that fails (a full disk, a store that keeps failing), the writer is
        aborted: the finished shards and the journal stay for ``resume``.
        """
        if self._closed:
            raise ValueError("ShardWriter is already closed")
        try:
            manifest = self._finish()
        except BaseException:
            self.abort()
            raise
        self._target.close()
        self._closed = True
        return manifest

    def _finish(self) -> Manifest:
        if self._current is not None:
            self._finish_shard()
        info = self.info
        manifest = Manifest(
            backend=self.options.backend,
            codec=self.options.codec,
            num_samples=self._num_samples,
            num_bytes=sum(s.num_bytes for s in self._shards),
            fields=tuple(self._fields),
            shards=tuple(self._shards),
            classes=self.classes,
            class_to_idx=None
            if self.classes is None
            else {c: i for i, c in enumerate(self.classes)},
            seed=info.get("seed"),
            shuffle=bool(info.get("shuffle", False)),
            options={**asdict(self.options), **info.get("options", {})},
            input_bytes=int(info.get("input_bytes", 0)),
            skipped=tuple(SkippedFile(str(p), str(r)) for p, r in info.get("skipped", ())),
            shardio_version=__version__,
            version=self.options.version,
        )
        self._target.write_manifest(manifest)
        self._target.finish()
        return manifest

    def abort(self) -> None:
        """Drop the partial shard; finished shards and the journal stay for ``resume``."""
        if self._current is not None:
            self._current.abort()
            self._current = None
        self._target.close()
        self._closed = True
