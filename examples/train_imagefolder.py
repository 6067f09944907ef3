"""Train a classifier on an ImageFolder through shardio: pack, stream, checkpoint, resume.

    python examples/train_imagefolder.py --data train/ --packed out/train --steps 1000
    python examples/train_imagefolder.py --data out/train --steps 2000 --resume
    torchrun --nproc-per-node 2 examples/train_imagefolder.py --data out/train --steps 1000

``--data`` is a folder of class folders (packed once into ``--packed``; a later run finds
the pack there) or a dataset packed already. Batches come from ``shardio.loader`` and reach
the device one step ahead through ``shardio.DevicePrefetcher`` (CUDA when there is one,
else the CPU). Every ``--checkpoint-every`` steps and at the end the model, the optimizer
and every rank's reading position are saved; ``--resume`` continues from there with the
very batches an uninterrupted run would have read next. Under ``torchrun`` each process is
one rank of a DistributedDataParallel job (nccl on CUDA, gloo on the CPU); the dataset
splits itself over the ranks, each of which yields the same number of batches.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import shardio

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` lists it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", required=True,
                        help="an ImageFolder (class folders of images) or a packed dataset")
    parser.add_argument("--packed", help="where to pack --data when it is an ImageFolder")
    parser.add_argument("--steps", type=int, default=1000, help="total training steps")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--num-workers", type=int, default=4, help="loader workers per rank")
    parser.add_argument("--image-size", type=int, default=64, help="side of the random crops")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="the data order and the model's init")
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--log-file", help="append one JSON line per step here (rank 0)")
    args = parser.parse_args(argv)
    if not (Path(args.data) / "manifest.json").exists() and args.packed is None:
        parser.error(f"{args.data} is not a packed dataset: give --packed OUT to pack it there")
    return args


def start_distributed() -> tuple[int, int, torch.device]:
    """Join the process group when started by ``torchrun``; (rank, world size, device)."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return dist.get_rank(), dist.get_world_size(), torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), torch.device("cpu")


def dataset_path(args: argparse.Namespace, rank: int) -> str:
    """The packed dataset: ``--data`` itself, or ``--packed`` after rank 0 packed it there."""
    if (Path(args.data) / "manifest.json").exists():
        return str(args.data)
    if rank == 0 and not (Path(args.packed) / "manifest.json").exists():
        summary = shardio.pack(args.data, args.packed)
        print(f"packed {summary.samples} samples of {args.data} into {args.packed}")
    if dist.is_initialized():
        dist.barrier()  # the other ranks open the pack once it is complete
    return str(args.packed)


def tiny_net(num_classes: int) -> nn.Module:
    """A few-layer CNN: small enough for the CPU, real enough to learn."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


def gather(state: Any, world_size: int) -> list[Any]:
    """Every rank's ``state``, in rank order (only the ranks' own in a single process)."""
    if world_size == 1:
        return [state]
    states: list[Any] = [None] * world_size
    dist.all_gather_object(states, state)
    return states


def save_checkpoint(path: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    prefetcher: shardio.DevicePrefetcher[Any], rank: int, world_size: int) -> None:
    """Write the checkpoint atomically (rank 0); every rank's reading position goes in it.

    The prefetcher's state, not the loader's: the prefetcher has already taken the next
    batch, which this step has not trained on.
    """
    loaders = gather(prefetcher.state_dict(), world_size)
    if rank == 0:
        module = model.module if isinstance(model, DistributedDataParallel) else model
        tmp = f"{path}.tmp"
        torch.save({"step": step, "model": module.state_dict(),
                    "optimizer": optimizer.state_dict(), "loaders": loaders}, tmp)
        os.replace(tmp, path)  # a run killed while saving keeps the previous checkpoint


def load_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                    prefetcher: shardio.DevicePrefetcher[Any], rank: int, world_size: int
                    ) -> int:
    """Restore the model, the optimizer and this rank's position; the step reached.

    Saved by another number of ranks, the ranks' positions are merged: every sample not
    yet read in that epoch is then read exactly once by the ranks of this run.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # no arbitrary unpickling
    module = model.module if isinstance(model, DistributedDataParallel) else model
    module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    loaders = checkpoint["loaders"]
    same_ranks = len(loaders) == world_size
    prefetcher.load_state_dict(loaders[rank] if same_ranks else shardio.merge_states(loaders))
    return int(checkpoint["step"])


def main(argv: list[str] | None = None) -> None:
    """Train for ``--steps`` steps, over as many epochs as that takes."""
    args = parse_args(argv)
    rank, world_size, device = start_distributed()
    path = dataset_path(args, rank)
    torch.manual_seed(args.seed)  # the same initial weights on every rank

    dataset = shardio.StreamingDataset(path, decode="tensor", seed=args.seed,
                                       crop=shardio.RandomResizedCrop(args.image_size))
    batches = shardio.loader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
    prefetcher = shardio.DevicePrefetcher(batches, device, convert_float=True, mean=MEAN, std=STD)

    model: nn.Module = tiny_net(len(dataset.classes)).to(device)
    if world_size > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    if args.resume:
        step = load_checkpoint(args.checkpoint, model, optimizer, prefetcher, rank, world_size)
        if rank == 0:
            print(f"resumed at step {step}, epoch {batches.epoch}")

    log = open(args.log_file, "a") if args.log_file and rank == 0 else None  # noqa: SIM115
    while step < args.steps:
        for images, labels in prefetcher:  # one epoch; the next pass reads the next one
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if log is not None:
                log.write(json.dumps({"step": step, "epoch": batches.epoch, "loss": loss.item(),
                                      "labels": labels.tolist()}) + "\n")
            if rank == 0 and step % 10 == 0:
                print(f"step {step}/{args.steps} epoch {batches.epoch} loss {loss.item():.4f}")
            if step % args.checkpoint_every == 0 or step == args.steps:
                save_checkpoint(args.checkpoint, step, model, optimizer, prefetcher, rank,
                                world_size)
            if step == args.steps:
                break
    if log is not None:
        log.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
