"""How a sample leaves the dataset: raw, decoded with Pillow, or as uint8 tensors, cropped or
not (``decode=``, ``fields=``, ``crop=``); shared by ``StreamingDataset`` and ``IndexedDataset``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from shardio.decode.crop import Crop, Cropper
from shardio.decode.fields import FieldDecoder, Fields
from shardio.format.manifest import Manifest
from shardio.format.record import INDEX_FIELD, KEY_FIELD
from shardio.torch.collate import decode_shared, field_decoder, image_and_label, open_pending
from shardio.torch.resize import resize_box

Decode = Literal["auto", "raw", "pil", "tensor"]


class SampleDecoder:
    """Turns a raw sample dict into what the dataset yields, per ``decode`` mode.

    ``raw``: the dict (``transform`` applied to it); ``pil``: ``(PIL RGB image,
    label)`` like ``torchvision.datasets.ImageFolder``; ``tensor``: ``(uint8 CHW
    tensor, label)``. ``pil`` and ``tensor`` need an ImageFolder pack (at ``path``, of
    ``num_classes`` classes): a record that is no ``image``/``label`` pair of its classes
    raises ``DecodeError`` (``collate.image_and_label``).
    """

    def __init__(
        self,
        mode: str,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        draft_size: tuple[int, int] | None = None,
        cropper: Cropper | None = None,
        num_classes: int = 0,
        path: str = "",
    ) -> None:
        self.mode = mode
        self.num_classes, self.path = num_classes, path
        self.transform = transform
        self.target_transform = target_transform
        self.draft_size = draft_size
        self.cropper = cropper
        """Every image cropped to one size (``crop=``), shared with the batch decoder."""

    def __call__(self, sample: dict[str, Any]) -> Any:
        if self.mode == "raw":
            return self.transform(sample) if self.transform else sample
        data, label = image_and_label(sample, self.num_classes, self.path)
        if self.cropper is not None:
            pending = self.cropper.open(data, sample[INDEX_FIELD], sample[KEY_FIELD])
            pixels = np.empty(pending.shape, np.uint8)
            pending.decode_into(pixels)
            if self.mode == "pil":
                from PIL import Image

                image: Any = Image.fromarray(pixels)
            else:
                image = torch.from_numpy(pixels).permute(2, 0, 1)
        elif self.mode == "pil":
            from shardio.decode.image import decode_image

            image = decode_image(data, draft_size=self.draft_size, key=sample[KEY_FIELD])
        else:
            from shardio.torch.collate import decode_tensor

            image = decode_tensor(data, draft_size=self.draft_size, key=sample[KEY_FIELD])
        return self.finish(image, label)

    def finish(self, image: Any, label: Any) -> Any:
        """``(image, label)`` after ``transform`` and ``target_transform``."""
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    @property
    def shares_memory(self) -> bool:
        """Whether a DataLoader worker's images are decoded a group at a time into
        shared memory (``tensor`` mode: ``shardio.torch.collate.decode_shared``)."""
        return self.mode == "tensor"

    def complete(self, sample: Mapping[str, Any], image: Any) -> Any:
        """``self(sample)`` for a sample whose image ``decode_group`` decoded (and checked)."""
        return self.finish(image, sample["label"])

    def decode_group(self, samples: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The images of ``samples`` (before ``transform``) as views of one shared block.

        Raises:
            DecodeError: an image does not decode, or a record does not fit the layout.
        """
        return decode_shared([
            open_pending(image_and_label(s, self.num_classes, self.path)[0], s,
                         draft_size=self.draft_size, cropper=self.cropper)
            for s in samples])


def resolve_decode(decode: str, labelled: bool, path: str) -> str:
    """The concrete decode mode: ``auto`` is ``pil`` on ImageFolder packs, else ``raw``."""
    if decode == "auto":
        return "pil" if labelled else "raw"
    if decode not in ("raw", "pil", "tensor"):
        raise ValueError(f"decode must be 'auto', 'raw', 'pil' or 'tensor', got {decode!r}")
    if decode != "raw" and not labelled:
        raise ValueError(
            f"{path}: decode={decode!r} alone needs an ImageFolder pack (fields 'image' and "
            "'label'); this dataset has none: name the fields to decode, e.g. "
            "fields=('jpg', 'cls'), or use decode='raw'"
        )
    return decode


def make_cropper(path: str, crop: Crop | None, seed: int, mode: str,
             draft_size: tuple[int, int] | None) -> Cropper | None:
    """The ``Cropper`` of ``crop=``, or None; refused where it cannot apply."""
    if crop is None:
        return None
    if mode not in ("pil", "tensor"):
        raise ValueError(
            f"{path}: crop= crops decoded images, but decode={mode!r} yields their bytes: "
            "pass decode='pil' or 'tensor' (on a pack that is no ImageFolder, with fields= "
            "naming its image fields, e.g. fields=('jpg', 'cls'))")
    if draft_size is not None:
        raise ValueError(f"{path}: crop= picks each JPEG's decode scale itself; pass crop= "
                         "or draft_size=, not both")
    return Cropper(crop, seed, resize=resize_box)


def make_decoder(mode: str, fields: Fields | Sequence[str] | None, *, manifest: Manifest,
                 path: str, transform: Callable[[Any], Any] | None,
                 target_transform: Callable[[Any], Any] | None,
                 draft_size: tuple[int, int] | None, cropper: Cropper | None,
                 ) -> SampleDecoder | FieldDecoder:
    """What a dataset hands each sample out through: the ``decode=`` mode's, or with
    ``fields=`` one decoder a field (``collate.field_decoder``)."""
    if fields is None:
        return SampleDecoder(mode, transform=transform, target_transform=target_transform,
                             draft_size=draft_size, cropper=cropper,
                             num_classes=len(manifest.classes or ()), path=path)
    return field_decoder(fields, mode=mode, manifest=manifest, path=path, transform=transform,
                         target_transform=target_transform, draft_size=draft_size,
                         cropper=cropper)
