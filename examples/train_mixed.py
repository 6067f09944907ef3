"""Train on several packed datasets at once, mixed by weight (a large web set 3:1 a curated one).

    python examples/train_mixed.py --source out/web:3 --source out/curated:1 --epochs 10
    python examples/train_mixed.py --source out/web:3 --source out/curated:1 --epoch-size 100000

Each ``--source PATH[:WEIGHT]`` is one ``shardio.Source`` named after its folder; every
epoch draws ``--epoch-size`` samples (default: the sources' total) shared by weight, batches
mixing the sources. The sources must have the same classes, so that a label means one class.
Samples are read raw, so that each says which source it came from (``__source__``), and
decoded by ``shardio.DeviceDecoder`` (nvJPEG on CUDA, shardio's decoder on the CPU). After
each epoch one JSON line gives the samples drawn from each source.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch
from torch import nn

import shardio


def source(spec: str) -> shardio.Source:
    """``PATH[:WEIGHT]`` as a ``shardio.Source`` named after the folder."""
    path, _, weight = spec.rpartition(":")
    if not path or not weight.replace(".", "", 1).isdigit():
        path, weight = spec, "1"
    return shardio.Source(path, weight=float(weight), name=Path(path).name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` lists it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--source", type=source, action="append", required=True,
                        metavar="PATH[:WEIGHT]", help="a packed dataset and its weight (default 1)")
    parser.add_argument("--epoch-size", type=int, help="samples per epoch (default: all)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train ``--epochs`` epochs of the mixture, counting where each sample came from."""
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    dataset = shardio.StreamingDataset(args.source, epoch_size=args.epoch_size, decode="raw",
                                       seed=args.seed)
    batches = shardio.loader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
    # the crops are drawn from (seed, epoch, sample): the dataset's seed, the loader's epoch
    decoder = shardio.DeviceDecoder(device, crop=shardio.RandomResizedCrop(args.image_size),
                                    seed=args.seed)
    classes = len(shardio.read_manifest(args.source[0].path).classes or ())
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for _ in range(args.epochs):
        drawn: Counter[str] = Counter()
        loss = torch.zeros(())
        for batch in batches:
            drawn.update(batch["__source__"])
            images, labels = decoder(batch, epoch=batches.epoch)
            assert isinstance(images, torch.Tensor) and labels is not None  # cropped, labelled
            loss = nn.functional.cross_entropy(model(images.float() / 255), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        print(json.dumps({"epoch": batches.epoch, "samples": dict(sorted(drawn.items())),
                          "loss": loss.item()}))


if __name__ == "__main__":
    main()
