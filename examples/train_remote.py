"""Train from a dataset in object storage (S3, GCS, Azure, any fsspec URL) through the node cache.

    python examples/train_remote.py --url s3://my-bucket/train --pack train/ --steps 1000
    python examples/train_remote.py --url s3://my-bucket/train --cache-dir /local/ssd/shardio

``--pack SRC`` packs a local folder straight to ``--url`` first, unless a dataset is there
already. Reading fetches ranges of records a few ahead of the loader into the node cache
(``--cache-dir``, never more than ``--max-cache-bytes``): every worker, rank and job of the
node naming that folder shares it, so each range is downloaded once per node, and a second
run is served from the local disk. Credentials are the backend's own: the ``AWS_*``
environment (``AWS_ENDPOINT_URL`` for MinIO, Ceph, R2, ...), ``~/.aws`` profiles, and so on.
At the end one JSON line says what was trained and how much the cache holds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

import shardio


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` lists it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", required=True, help="the dataset's URL, e.g. s3://bucket/train")
    parser.add_argument("--pack", metavar="SRC", help="pack this local ImageFolder to --url first")
    parser.add_argument("--cache-dir", help="the node cache (default: $SHARDIO_CACHE_DIR, "
                                            "else ~/.cache/shardio); on a node-local disk")
    parser.add_argument("--max-cache-bytes", type=int, help="the cache's hard budget")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Pack if asked, then train ``--steps`` steps reading through the node cache."""
    args = parse_args(argv)
    remote = shardio.RemoteOptions(cache_dir=args.cache_dir, max_cache_bytes=args.max_cache_bytes)
    if args.pack is not None:
        try:
            shardio.read_manifest(args.url, remote=remote)
            print(f"{args.url} holds a dataset already: not packing {args.pack}")
        except shardio.ManifestNotFoundError:
            summary = shardio.pack(args.pack, args.url, remote=remote)
            print(f"packed {summary.samples} samples of {args.pack} to {args.url}")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    dataset = shardio.StreamingDataset(args.url, decode="tensor", seed=args.seed, remote=remote,
                                       crop=shardio.RandomResizedCrop(args.image_size))
    batches = shardio.loader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
    prefetcher = shardio.DevicePrefetcher(batches, device, convert_float=True)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, len(dataset.classes)),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step = samples = 0
    loss = torch.zeros(())
    while step < args.steps:
        for images, labels in prefetcher:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            samples += len(labels)
            if step == args.steps:
                break
    cache = Path(args.cache_dir) if args.cache_dir else None
    cached = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache else None
    print(json.dumps({"steps": step, "samples": samples, "epoch": batches.epoch,
                      "loss": loss.item(), "cache_bytes": cached}))


if __name__ == "__main__":
    main()
