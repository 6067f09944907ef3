"""A crop box resized into a batch buffer by torch's uint8 kernels.

``shardio.decode.crop`` picks the box and decodes at the smallest JPEG scale that covers it;
this resizes the box to the output. Pillow's antialiased bilinear resize was half of
a 500x375 crop's time here; torch's (``interpolate(..., antialias=True)`` on uint8,
vectorised for 3-channel pixels laid out as decoded) computes the same filter about
4x faster, with pixels within a few levels of Pillow's (``tests/decode/test_crop.py``).
Imports torch, so it lives beside the dataset, which hands it to ``crop.Cropper``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from shardio.decode.crop import Box


def resize_box(pixels: np.ndarray, box: Box, out: np.ndarray, flip: bool) -> None:
    """Resize ``box`` of ``(H, W, 3)`` uint8 ``pixels`` into ``out``, mirrored if ``flip``.

    The box's edges are rounded to whole pixels of ``pixels`` (a box from a reduced
    scale moves by under half a pixel of it), as torchvision's tensor crops are.
    """
    height, width = pixels.shape[:2]
    left = min(max(round(box[0]), 0), width - 1)
    top = min(max(round(box[1]), 0), height - 1)
    right = min(max(round(box[2]), left + 1), width)
    bottom = min(max(round(box[3]), top + 1), height)
    # HWC viewed as a 1x3xHxW batch: channels-last strides, which the uint8 kernel wants
    source = torch.from_numpy(pixels[top:bottom, left:right]).permute(2, 0, 1).unsqueeze(0)
    size = (out.shape[0], out.shape[1])
    if source.shape[-2:] == size:
        resized = source[0]
    else:
        resized = F.interpolate(source, size=size, mode="bilinear", antialias=True,
                                align_corners=False)[0]
    if flip:
        resized = resized.flip(-1)
    torch.from_numpy(out).copy_(resized.permute(1, 2, 0))
