"""A dataset built before ``init_process_group`` still splits over the ranks.

Two processes join a real gloo process group on 127.0.0.1 after building their
datasets; rank and world size are read when iteration starts, in forked and in
spawned DataLoader workers, so the ranks share the dataset instead of each
reading all of it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shardio import ShardWriter, WriteOptions

pytestmark = pytest.mark.servers

NUM_SAMPLES = 45

RANK = """
import json, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
from shardio.torch.loader import loader
from shardio.torch.dataset import StreamingDataset

path, rank, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
plain = StreamingDataset(path, decode="raw", shuffle_buffer=16)  # no process group yet
batched = StreamingDataset(path, decode="raw", shuffle_buffer=16)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
forked = [i for b in DataLoader(plain, batch_size=8, num_workers=1)
          for i in b["__index__"].tolist()]
spawned = [i for b in loader(batched, batch_size=8, num_workers=1, multiprocessing_context="spawn")
           for i in b.indices.tolist()]
state = plain.state_dict(num_batches=2, batch_size=8)
with open(out, "w") as f:
    json.dump({"len": len(plain), "forked": forked, "spawned": spawned, "state": state}, f)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=16)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:03d}", "n": i})
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dataset_built_before_init_process_group_splits_over_ranks(
    pack: Path, tmp_path: Path
) -> None:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(pack), str(rank), str(port),
             str(tmp_path / f"{rank}.json")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, output
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    per_rank = -(-NUM_SAMPLES // 2)
    for rank, got in enumerate(ranks):
        assert got["len"] == per_rank
        assert len(got["forked"]) == len(got["spawned"]) == per_rank
        assert set(got["forked"]) == set(got["spawned"])  # the same rank's part, both ways
        assert got["state"]["world_size"] == 2 and list(got["state"]["consumed"]) == [str(rank)]
    both = ranks[0]["forked"] + ranks[1]["forked"]
    assert set(both) == set(range(NUM_SAMPLES))
    assert len(both) - NUM_SAMPLES == 1  # only the documented padding
