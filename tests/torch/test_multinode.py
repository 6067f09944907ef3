"""Ranks from the environment, and two nodes of ``torchrun`` reading one dataset.

Every rank of every node must yield ``len(dataset)`` samples, the same count
everywhere, and together every sample exactly once plus the documented padding
(the tail repeats samples so that counts are equal). The two "nodes" are two
``torchrun --nnodes 2`` agents on 127.0.0.1 with a gloo process group, each
with its own cache folder (``SHARDIO_CACHE_DIR``). Read from moto's S3, each
node talks to S3 through a proxy of its own, which records every ranged GET:
a range of records must be fetched once per node, whichever of the node's
ranks needed it.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch.distributed as dist
from storage_servers import S3Endpoint

from benchmarks import storage_proxy
from benchmarks.storage_proxy import FaultProxy
from shardio import StreamingDataset
from shardio.backends import open_shard
from shardio.format.manifest import load_manifest
from shardio.packing.pack import pack
from shardio.packing.writer import WriteOptions
from shardio.storage import open_store
from shardio.torch.dataset import resolve_rank
from shardio.torch.distributed import env_rank

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

NUM_SAMPLES = 103  # not a multiple of 4 ranks: one padded sample
NODES, PROCS_PER_NODE = 2, 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """103 samples of distinct bytes in 7 shards."""
    src = tmp_path_factory.mktemp("src")
    for i in range(NUM_SAMPLES):
        (src / f"s{i:03d}.bin").write_bytes(i.to_bytes(2, "big") * (50 + i))
    out = tmp_path_factory.mktemp("ds") / "ds"
    pack(src, out, options=WriteOptions(max_shard_samples=15), num_workers=1)
    return out


def test_env_rank_reads_both_variables_or_refuses_a_half_set_environment() -> None:
    assert env_rank({}) is None
    assert env_rank({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4)
    with pytest.raises(ValueError, match="RANK='1' is set but WORLD_SIZE is not"):
        env_rank({"RANK": "1"})
    with pytest.raises(ValueError, match="WORLD_SIZE='2' is set but RANK is not"):
        env_rank({"WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        env_rank({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="RANK=4 and WORLD_SIZE=4 do not fit"):
        env_rank({"RANK": "4", "WORLD_SIZE": "4"})


def test_explicit_arguments_then_torch_distributed_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_rank(None, None) == (0, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert resolve_rank(None, None) == (1, 3)
    assert resolve_rank(0, 2) == (0, 2)  # explicit arguments win
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        assert resolve_rank(None, None) == (0, 1)  # an initialised process group wins
        assert resolve_rank(1, 2) == (1, 2)
    finally:
        dist.destroy_process_group()
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="RANK=1 and WORLD_SIZE=1 do not fit"):
        resolve_rank(None, None)


def test_ranks_from_the_environment_split_the_dataset(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: Counter[int] = Counter()
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        ds = StreamingDataset(dataset, decode="raw", seed=1)
        got = [int(sample["__index__"]) for sample in ds]
        assert len(got) == len(ds) == 35  # ceil(103 / 3)
        seen.update(got)
    assert set(seen) == set(range(NUM_SAMPLES))
    assert sum(seen.values()) - NUM_SAMPLES == 2  # the documented padding, nothing else


WORKER = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    from shardio import RemoteOptions, StreamingDataset

    dataset, out, range_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    remote = RemoteOptions(range_bytes=range_bytes)  # cache_dir: $SHARDIO_CACHE_DIR, per node
    made_before_init = StreamingDataset(dataset, decode="raw", seed=4, remote=remote)
    dist.init_process_group("gloo")
    ds = StreamingDataset(dataset, decode="raw", seed=4, remote=remote)
    indices = [int(s["__index__"]) for s in ds]
    early = [int(s["__index__"]) for s in made_before_init]
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, len(indices))  # DDP needs equal counts: check it in-job
    report = {name: int(os.environ[name]) for name in
              ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    report.update(len=len(ds), indices=indices, early=early, counts=counts,
                  cache=os.environ["SHARDIO_CACHE_DIR"])
    with open(os.path.join(out, f"rank-{report['RANK']}.json"), "w") as fh:
        json.dump(report, fh)
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_two_nodes(dataset: str, tmp_path: Path, env: dict[str, str],
                  endpoints: list[str] | None = None, range_bytes: int = 16 << 20) -> list[dict]:
    """Two torchrun agents (nodes) of ``PROCS_PER_NODE`` ranks each; their ranks' reports.

    ``endpoints``: each node's ``AWS_ENDPOINT_URL``; ``range_bytes``: the fetch unit.
    """
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    reports = tmp_path / "reports"
    reports.mkdir()
    port = _free_port()
    agents = []
    for node in range(NODES):
        node_env = {**env, "SHARDIO_CACHE_DIR": str(tmp_path / f"cache-node{node}"),
                    "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
        if endpoints is not None:
            node_env["AWS_ENDPOINT_URL"] = endpoints[node]
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}",
             f"--nproc-per-node={PROCS_PER_NODE}", f"--node-rank={node}",
             "--master-addr=127.0.0.1", f"--master-port={port}", "--local-addr=127.0.0.1",
             "--max-restarts=0", str(script), dataset, str(reports), str(range_bytes)],
            env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [agent.communicate(timeout=240)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    for agent, output in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, output[-4000:]
    return [json.loads(p.read_text()) for p in sorted(reports.glob("rank-*.json"))]


def check_exactly_once(reports: list[dict], num_samples: int) -> None:
    """Every rank of every node: equal counts; together every sample once, plus padding."""
    world = NODES * PROCS_PER_NODE
    assert sorted(r["RANK"] for r in reports) == list(range(world))
    assert {(r["GROUP_RANK"], r["LOCAL_RANK"]) for r in reports} == {
        (n, p) for n in range(NODES) for p in range(PROCS_PER_NODE)}
    per_rank = -(-num_samples // world)
    for r in reports:
        assert r["WORLD_SIZE"] == world and r["LOCAL_WORLD_SIZE"] == PROCS_PER_NODE
        assert r["len"] == len(r["indices"]) == per_rank and r["counts"] == [per_rank] * world
        assert r["early"] == r["indices"]  # made before init_process_group: same split
    seen = Counter(i for r in reports for i in r["indices"])
    assert set(seen) == set(range(num_samples))
    assert sum(seen.values()) == per_rank * world  # padding: world * ceil(n / world) - n


def test_two_torchrun_nodes_read_every_sample_exactly_once(
    dataset: Path, tmp_path: Path
) -> None:
    reports = run_two_nodes(str(dataset), tmp_path, dict(os.environ))
    check_exactly_once(reports, NUM_SAMPLES)
    assert {r["cache"] for r in reports} == {str(tmp_path / f"cache-node{n}") for n in (0, 1)}


@pytest.fixture(scope="module")
def ranged_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 shards of 61 incompressible 3 KB samples: several 64 KB ranges per shard."""
    src = tmp_path_factory.mktemp("ranged-src")
    for i in range(2 * 61):
        (src / f"s{i:03d}.bin").write_bytes(random.Random(i).randbytes(3000))
    out = tmp_path_factory.mktemp("ranged") / "ds"
    pack(src, out, options=WriteOptions(max_shard_samples=61), num_workers=1)
    return out


def record_starts(dataset: Path) -> dict[int, tuple[str, int]]:
    """Sample index -> (shard name, byte offset of its record)."""
    manifest = load_manifest(dataset)
    starts = {}
    for shard in manifest.shards:
        reader = open_shard(manifest.backend, dataset / shard.name)
        try:
            for i in range(shard.num_samples):
                starts[shard.first_index + i] = (shard.name, reader.offset(i))
        finally:
            reader.close()
    return starts


def test_two_torchrun_nodes_read_an_s3_dataset_once_per_node(
    ranged_dataset: Path, tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(s3.url)
    for path in sorted(ranged_dataset.iterdir()):
        store.put_file(path.name, path)
    sizes = {path.name: path.stat().st_size for path in ranged_dataset.iterdir()}
    gets: list[tuple[int, str, str]] = []
    relay = storage_proxy._ProxyHandler.do_GET

    def recording(self: storage_proxy._ProxyHandler) -> None:
        gets.append((self.server.server_address[1], self.path.split("?", 1)[0],
                     self.headers.get("Range", "")))
        relay(self)

    monkeypatch.setattr(storage_proxy._ProxyHandler, "do_GET", recording)
    node1_proxy = FaultProxy(s3.moto.address)
    try:
        proxies = [s3.proxy.url, node1_proxy.url]
        reports = run_two_nodes(s3.url, tmp_path, dict(os.environ), endpoints=proxies,
                                range_bytes=64 << 10)
    finally:
        node1_proxy.close()
    num_samples = 2 * 61
    check_exactly_once(reports, num_samples)
    starts = record_starts(ranged_dataset)
    prefix = f"/{s3.bucket}/data/"
    for node, url in enumerate(proxies):
        port = int(url.rsplit(":", 1)[1])
        fetched = Counter(
            (path[len(prefix):], *_range_bounds(spec, sizes[path[len(prefix):]]))
            for p, path, spec in gets if p == port and spec and path.startswith(prefix))
        # records ranges end before the shard's tail (footer, index, keys: read per process)
        records = {r: n for r, n in fetched.items() if r[2] < sizes[r[0]]}
        assert records and max(records.values()) == 1, (
            f"node {node} fetched a range of records more than once: {fetched.most_common(3)}")
        readers: dict[tuple[str, int, int], set[int]] = {r: set() for r in records}
        for report in reports:
            if report["GROUP_RANK"] != node:
                continue
            for index in report["indices"]:
                shard, offset = starts[index]
                covering = [r for r in records if r[0] == shard and r[1] <= offset < r[2]]
                assert len(covering) == 1, f"node {node}: sample {index} in {covering}"
                readers[covering[0]].add(report["LOCAL_RANK"])
        shared = [r for r, ranks in readers.items() if len(ranks) == PROCS_PER_NODE]
        assert shared, "no range was needed by both ranks of a node: nothing shown"


def _range_bounds(spec: str, size: int) -> tuple[int, int]:
    """``(start, stop)`` of an HTTP ``Range: bytes=a-b`` or ``bytes=-n`` request."""
    first, _, last = spec.removeprefix("bytes=").partition("-")
    if first == "":
        return size - int(last), size
    return int(first), size if last == "" else min(size, int(last) + 1)
