"""``IndexedDataset``: map-style access, ``ds[i]`` through the shard index, for any Sampler."""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, get_worker_info

from shardio.decode.crop import CenterCrop
from shardio.decode.fields import FieldDecoder, Fields
from shardio.errors import DecodeError
from shardio.reading.blockcache import DEFAULT_CACHE_BYTES
from shardio.reading.classes import ClassAttributes
from shardio.reading.reader import DatasetReader
from shardio.storage.options import RemoteOptions
from shardio.torch.dataset import available_cpus
from shardio.torch.decoders import (
    Decode,
    SampleDecoder,
    make_cropper,
    make_decoder,
    resolve_decode,
)


class IndexedDataset(ClassAttributes, Dataset[Any]):
    """Map-style access: ``ds[i]`` in O(1) through the shard index, any Sampler works."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        decode: Decode = "auto",
        fields: Fields | Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        draft_size: tuple[int, int] | None = None,
        crop: CenterCrop | None = None,
        verify: bool = True,
        remote: RemoteOptions | None = None,
        block_cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        """Open the dataset at ``path`` (a folder or a URL); see ``StreamingDataset`` for the
        decode, ``fields``, ``crop`` and ``remote`` options.

        ``crop`` takes ``shardio.CenterCrop`` (evaluation): the same box every time a
        sample is read. A random crop drawn per epoch needs the epoch in every worker,
        which a map-style dataset does not get: ``StreamingDataset(crop=...)`` has it.

        ``block_cache_bytes``: decoded blocks each process keeps (format v3), so that a
        sampler coming back to a block reads, checks and inflates it once; a block is
        checked when it enters the cache. 0 keeps none.
        """
        self.path = str(path)
        self.verify = verify
        self._reader = DatasetReader(path, verify=verify, remote=remote,
                                     block_cache_bytes=block_cache_bytes)
        self._pid = os.getpid()
        self.manifest = self._reader.manifest
        mode = resolve_decode(decode, self.manifest.is_imagefolder or fields is not None, self.path)
        if crop is not None and not isinstance(crop, CenterCrop):
            raise ValueError(
                f"{self.path}: IndexedDataset takes crop=shardio.CenterCrop only, got {crop!r}: "
                "a random crop drawn per epoch needs the epoch in every DataLoader worker; "
                "use StreamingDataset(crop=...), which has it")
        cropper = make_cropper(self.path, crop, 0, mode, draft_size)
        self.decoder: SampleDecoder | FieldDecoder = make_decoder(
            mode, fields, manifest=self.manifest, path=self.path, transform=transform,
            target_transform=target_transform, draft_size=draft_size, cropper=cropper)

    def _reader_here(self) -> DatasetReader:
        # A forked DataLoader worker inherits the parent's open maps and LMDB
        # environments, which must not be shared: it opens its own.
        if self._pid != os.getpid():
            self._reader = self._reader.reopened()
            self._pid = os.getpid()
        return self._reader

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled in a ``spawn``/``forkserver`` worker: the reader arrives closed."""
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.manifest.num_samples

    def _normalise(self, index: int) -> int:
        """``index`` counted from the end when negative, like a list.

        Raises:
            TypeError: ``index`` is not an integer (an int, a numpy integer, a 0-d integer
                tensor); a bool, float, str or slice is refused, not read as a position.
            IndexError: ``index`` is outside ``-len(self)..len(self) - 1``.
        """
        if type(index) is not int:  # a sampler's indices are ints: one test for them
            try:
                if isinstance(index, bool) or (isinstance(index, torch.Tensor) and (
                        index.ndim or index.dtype == torch.bool)):
                    raise TypeError  # each an integer to operator.index, none a position
                index = operator.index(index)
            except TypeError:
                raise TypeError(
                    f"{self.path}: IndexedDataset takes one int index, a sample's position, as "
                    f"torch's map-style datasets do; got {type(index).__name__} {index!r}. "
                    "For several samples index each one, or use torch.utils.data.Subset"
                ) from None
        size = len(self)
        if not -size <= index < size:
            raise IndexError(
                f"{self.path}: sample {index} out of range for a dataset of {size} samples"
            )
        return index + size if index < 0 else index

    def __getitem__(self, index: int) -> Any:
        return self.decoder(self._reader_here().get(self._normalise(index)))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Batched fetch for the DataLoader: read in storage order, returned in the order asked.

        Raises:
            TypeError: an index is not an integer (``_normalise``).
            IndexError: an index is out of range (negative ones count from the end).
        """
        reader = self._reader_here()
        size = len(self)
        # a sampler's batch (ints in range) taken as it is; anything else index by index
        wanted = (list(indices) if len(indices) and all(type(i) is int for i in indices) and (
                      min(indices) >= 0 and max(indices) < size)
                  else [self._normalise(i) for i in indices])
        order = sorted(set(wanted))
        info = get_worker_info()
        # a checker thread beside each reading process pays only where a core is free for it
        ahead = (info.num_workers if info is not None else 1) < available_cpus()
        fetched = dict(zip(order, reader.get_many(order, decode_ahead=ahead), strict=True))
        # an index asked twice gets a dict of its own (a transform may change it in place)
        samples = ([fetched[i] for i in wanted] if len(order) == len(wanted)
                   else [dict(fetched[i]) for i in wanted])
        decoder = self.decoder
        if type(decoder) is SampleDecoder and decoder.mode == "raw" and decoder.transform is None:
            return samples  # what the decoder would give: each dict as it is
        if decoder.shares_memory and samples and (
                get_worker_info() is not None):  # the batch's images in one shared block
            try:
                parts = decoder.decode_group(samples)
            except DecodeError:
                pass  # one by one below, so that the error is the first bad sample's
            else:
                return [decoder.complete(s, part)
                        for s, part in zip(samples, parts, strict=True)]
        return [decoder(s) for s in samples]

    def close(self) -> None:
        """Release the open shard files."""
        self._reader.close()
