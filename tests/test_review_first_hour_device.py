"""Issue 31, the first hour of a new user: items 2 (a device that is not there) and 6
(crops and fields).

A script asking for ``"cuda"`` on a machine without CUDA is told so instead of
training on the CPU without a word; the CPU is what ``"cpu"`` or ``device=None`` asks
for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import shardio  # noqa: E402  (after the torch skip)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
NO_CUDA = r"device 'cuda(:0)?' asked for, but CUDA is not available .*pass \"cpu\" or device=None"


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_asking_for_cuda_without_cuda_raises_and_says_how_to_get_the_cpu(
    imagefolder_pack: Path, device: object
) -> None:
    raw = shardio.loader(shardio.StreamingDataset(imagefolder_pack, decode="raw"),
                         batch_size=4, num_workers=0)
    with pytest.raises(RuntimeError, match=NO_CUDA):
        shardio.DevicePrefetcher(raw, device)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=NO_CUDA):
        shardio.DeviceDecoder(device)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=NO_CUDA):
        shardio.DeviceDecoder()  # its default is "cuda"


@pytest.mark.parametrize("device", ["cpu", None])
def test_cpu_or_none_decodes_and_hands_over_on_the_cpu(
    imagefolder_pack: Path, device: str | None
) -> None:
    raw = shardio.loader(shardio.StreamingDataset(imagefolder_pack, decode="raw"),
                         batch_size=4, num_workers=0)
    decoder = shardio.DeviceDecoder(device, crop=shardio.CenterCrop(8))
    prefetcher = shardio.DevicePrefetcher(raw, device, decode=decoder, convert_float=True)
    assert decoder.device == prefetcher.device == torch.device("cpu")
    count = 0
    for images, labels in prefetcher:
        assert images.device.type == "cpu" and images.dtype == torch.float32
        assert tuple(images.shape[1:]) == (3, 8, 8) and len(labels) == len(images)
        count += len(labels)
    assert count == len(shardio.StreamingDataset(imagefolder_pack))
