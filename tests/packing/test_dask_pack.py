"""``shardio pack --engine dask`` on a real ``distributed.LocalCluster``: 2 worker processes.

The cluster lives for the module; each pack connects to it by address, as a
pack to a remote cluster would. Walk tasks get a budget of 8 entries here, so
the walk of every tree is split over both workers. Failures are injected in
the workers by a worker plugin (patched ``RecordsShardWriter.add``): a
worker that SIGKILLs itself three records into a shard, and shards that stall
until the test releases them, so that the driver can be SIGKILLed with shards
in flight.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
import cloudpickle  # noqa: E402  # a dependency of distributed
from click.testing import CliRunner  # noqa: E402
from storage_servers import S3Endpoint  # noqa: E402

from shardio.cli import main  # noqa: E402
from shardio.errors import BadInputError, PackError  # noqa: E402
from shardio.format.manifest import JOURNAL_NAME, MANIFEST_NAME  # noqa: E402
from shardio.packing.journal import load_journal  # noqa: E402
from shardio.packing.pack import pack  # noqa: E402
from shardio.packing.writer import WriteOptions  # noqa: E402
from shardio.storage import RemoteOptions, open_store  # noqa: E402
from shardio.synth import make_photo, make_tiny_tree  # noqa: E402

pytestmark = [pytest.mark.dask, pytest.mark.servers]
pytest_plugins = ("storage_plugin",)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this module

OPTIONS = WriteOptions(max_shard_samples=5)
VARYING = ("out", "seconds", "files_per_s", "mb_per_s")
"""Summary fields that differ between two packs of the same input."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A scheduler and 2 single-threaded worker processes (with nannies) on 127.0.0.1."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  silence_logs=logging.CRITICAL) as local:
        yield local.scheduler_address


@pytest.fixture
def client(cluster: str) -> Iterator[Any]:
    """A client of the test's own, once both workers are up (a killed one restarts)."""
    with distributed.Client(cluster, set_as_default=False) as own:
        own.wait_for_workers(2, timeout=60)
        yield own


@pytest.fixture(autouse=True)
def small_walk_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardio.packing.engines.dask.MAX_ENTRIES", 8)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An ImageFolder of nested PNGs and JPEGs, and a generic tree with two-field samples."""
    rng = np.random.default_rng(5)
    images = tmp_path_factory.mktemp("imagefolder")
    for cls in ("cat", "dog", "eel"):
        for i in range(14):
            png = i % 4 == 0
            path = images / cls / ("", "a", "a/b")[i % 3] / f"img{i:02d}.{'png' if png else 'jpg'}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(make_photo(rng, 40, 30, fmt="PNG" if png else "JPEG"))
    generic = tmp_path_factory.mktemp("generic")
    make_tiny_tree(generic, num_files=120, seed=3, files_per_folder=9)
    for i, path in enumerate(sorted(generic.rglob("*.bin"))[::4]):
        path.with_suffix(".json").write_text(json.dumps({"i": i}))
    return {"imagefolder": images, "generic": generic}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _same(a: Any, b: Any) -> bool:
    one, two = a.to_json(), b.to_json()
    return all(one[k] == two[k] for k in one if k not in VARYING)


class Sabotage(distributed.WorkerPlugin):  # type: ignore[misc]
    """In every worker: SIGKILL itself 3 records into shard ``kill_shard`` (once per test), or
    stall 2 records into shards ``>= stall_from`` until ``marks/release`` exists."""

    name = "shardio-test-sabotage"

    def __init__(self, marks: Path, kill_shard: int = -1, stall_from: int = 1 << 30) -> None:
        self.marks, self.kill_shard, self.stall_from = str(marks), kill_shard, stall_from

    def setup(self, worker: Any) -> None:
        from shardio.backends.records import RecordsShardWriter

        self.original = original = RecordsShardWriter.add
        marks, kill_shard, stall_from = self.marks, self.kill_shard, self.stall_from

        def append(writer: Any, sample: Any) -> None:
            original(writer, sample)
            writer.appended = getattr(writer, "appended", 0) + 1
            number = int(writer.path.name[7:12])  # .shard-NNNNN-<attempt>.rec.tmp
            if number == kill_shard and writer.appended == 3:
                try:
                    fd = os.open(os.path.join(marks, "killed"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return  # the retry
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
            if number >= stall_from and writer.appended == 2:
                open(os.path.join(marks, f"stalled-{number}-{os.getpid()}"), "w").close()
                while not os.path.exists(os.path.join(marks, "release")):
                    time.sleep(0.01)

        RecordsShardWriter.add = append

    def teardown(self, worker: Any) -> None:
        from shardio.backends.records import RecordsShardWriter

        RecordsShardWriter.add = self.original


@pytest.fixture
def sabotage(client: Any, tmp_path: Path) -> Iterator[Any]:
    """``sabotage(**kwargs)`` installs ``Sabotage(marks, **kwargs)`` in every worker until the
    test ends; returns the marks folder."""
    marks = tmp_path / "marks"
    marks.mkdir()

    def install(**kwargs: int) -> Path:
        client.register_plugin(Sabotage(marks, **kwargs))
        return marks

    yield install
    (marks / "release").touch()
    client.unregister_worker_plugin(Sabotage.name)


@pytest.mark.parametrize(("tree", "backend", "class_folders"), [
    ("imagefolder", "records", False), ("generic", "lmdb", False), ("generic", "records", True)])
def test_a_dask_pack_is_byte_identical_to_a_local_pack(
    trees: dict[str, Path], tmp_path: Path, cluster: str, client: Any, tree: str, backend: str,
    class_folders: bool
) -> None:
    options = WriteOptions(backend=backend, max_shard_samples=5)
    local = pack(trees[tree], tmp_path / "local", options=options, num_workers=2, seed=4,
                 class_folders=class_folders)
    with distributed.get_task_stream(client=client) as stream:
        dask = pack(trees[tree], tmp_path / "dask", options=options, seed=4, engine="dask",
                    scheduler=cluster, class_folders=class_folders)
    assert _files(tmp_path / "dask") == _files(tmp_path / "local")
    assert _same(dask, local) and local.shards >= 8 and local.imagefolder == (tree == "imagefolder")
    assert dask.class_folders == class_folders
    ran = [(t["key"].split("-")[1], t["worker"]) for t in stream.data]
    for kind in ("walk", "shard"):  # both kinds of task, spread over both workers
        assert len({worker for k, worker in ran if k == kind}) == 2, ran


def test_a_worker_killed_mid_shard_is_retried_and_the_output_is_identical(
    trees: dict[str, Path], tmp_path: Path, cluster: str, client: Any, sabotage: Any
) -> None:
    workers = set(client.run(os.getpid).values())
    marks = sabotage(kill_shard=1)
    dask = pack(trees["generic"], tmp_path / "dask", options=OPTIONS, engine="dask",
                scheduler=cluster)
    killed = int((marks / "killed").read_text())
    assert killed in workers  # a worker of the cluster died three records into shard 1
    local = pack(trees["generic"], tmp_path / "local", options=OPTIONS, num_workers=1)
    assert _files(tmp_path / "dask") == _files(tmp_path / "local")  # no partial shard left
    assert _same(dask, local)
    client.wait_for_workers(2, timeout=60)
    assert killed not in set(client.run(os.getpid).values())  # the nanny started another


def _journaled(out: Path) -> list[int]:
    return [s["number"] for s in load_journal((out / JOURNAL_NAME).read_bytes())["shards"]]


def test_a_killed_driver_resumes_with_every_finished_shard_and_ends_identical(
    trees: dict[str, Path], tmp_path: Path, cluster: str, client: Any, sabotage: Any
) -> None:
    src, out = trees["imagefolder"], tmp_path / "out"
    marks = sabotage(stall_from=2)
    driver = subprocess.Popen(
        [sys.executable, "-m", "shardio", "pack", str(src), str(out), "--engine", "dask",
         "--scheduler", cluster, "--max-shard-samples", "5", "--seed", "2", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journaled: list[int] = []
    deadline = time.monotonic() + 120
    while not journaled or not any(m.name.startswith("stalled") for m in marks.iterdir()):
        assert driver.poll() is None, driver.communicate()  # still packing
        if time.monotonic() > deadline:  # a hang guard, not a speed check
            driver.kill()
            pytest.fail(f"the driver journaled no shard in 120 s: {driver.communicate()}")
        time.sleep(0.02)
        if (out / JOURNAL_NAME).exists():
            journaled = _journaled(out)
    driver.kill()
    driver.communicate()
    assert driver.returncode == -signal.SIGKILL and not (out / MANIFEST_NAME).exists()
    (marks / "release").touch()  # the dead driver's tasks finish: their shards are not journaled
    while any(client.processing().values()):
        time.sleep(0.02)
    journaled = _journaled(out)
    resumed = pack(src, out, options=OPTIONS, seed=2, resume=True, engine="dask",
                   scheduler=cluster)
    assert journaled and resumed.resumed_samples == 5 * len(journaled)
    local = pack(src, tmp_path / "local", options=OPTIONS, seed=2, num_workers=1)
    assert _files(out) == _files(tmp_path / "local")
    assert resumed.samples == local.samples == 42


def _bad_tree(root: Path) -> Path:
    rng = np.random.default_rng(1)
    for cls in ("cat", "dog"):
        for i in range(8):
            (root / cls / f"{i}.jpg").parent.mkdir(parents=True, exist_ok=True)
            (root / cls / f"{i}.jpg").write_bytes(make_photo(rng, 24, 16))
    # whole in form (start, a scan, end marker): only a decode (check_images) finds it
    (root / "dog" / "5.jpg").write_bytes(b"\xff\xd8\xff\xda\x00\x02 not really a JPEG \xff\xd9")
    return root


@pytest.mark.parametrize("when", ["scan", "build"])
def test_bad_input_is_reported_as_a_local_pack_reports_it(
    tmp_path: Path, cluster: str, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    _bad_tree(tmp_path / "src")
    if when == "scan":
        (tmp_path / "src" / "cat" / "empty.jpg").write_bytes(b"")
    monkeypatch.chdir(tmp_path)  # a relative SRC: workers open files relative to this folder
    flags = {"check_images": when == "build", "options": OPTIONS, "seed": 1}
    errors = []
    for engine in ("local", "dask"):
        with pytest.raises(BadInputError) as caught:
            pack("src", f"fail-{engine}", engine=engine, scheduler=cluster if engine == "dask"
                 else None, **flags)  # type: ignore[arg-type]
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert ("src/cat/empty.jpg: empty file" if when == "scan" else
            "src/dog/5.jpg: does not decode") in errors[0]
    local = pack("src", "local", skip_bad=True, num_workers=2, **flags)  # type: ignore[arg-type]
    dask = pack("src", "dask", skip_bad=True, engine="dask", scheduler=cluster,
                **flags)  # type: ignore[arg-type]
    assert _files(tmp_path / "dask") == _files(tmp_path / "local")  # the manifest lists it too
    assert _same(dask, local) and len(local.skipped) == 1 and local.samples == 15 + (when == "scan")


def test_cli_engine_dask_prints_the_local_summary_and_one_progress_bar(
    trees: dict[str, Path], tmp_path: Path, cluster: str
) -> None:
    runner = CliRunner()
    src, flags = str(trees["generic"]), ["--json", "--max-shard-samples", "5", "--progress"]
    local = runner.invoke(main, ["pack", src, str(tmp_path / "local"), *flags])
    dask = runner.invoke(main, ["pack", src, str(tmp_path / "dask"), *flags, "--engine", "dask",
                                "--scheduler", cluster])
    assert local.exit_code == dask.exit_code == 0, dask.output
    one, two = json.loads(local.stdout), json.loads(dask.stdout)
    assert {k: v for k, v in one.items() if k not in VARYING} == {
        k: v for k, v in two.items() if k not in VARYING}
    assert "MB/s" in dask.stderr and "100%" in dask.stderr and "file/s" in dask.stderr
    wrong = runner.invoke(main, ["pack", str(trees["generic"]), str(tmp_path / "x"),
                                 "--scheduler", cluster])
    assert wrong.exit_code == 2 and "--engine dask" in wrong.output


def test_a_dask_pack_to_a_url_is_identical_to_a_local_pack(
    trees: dict[str, Path], tmp_path: Path, cluster: str, s3: S3Endpoint
) -> None:
    # the workers started before this test's AWS_* environment: credentials go with the store
    storage = {"endpoint_url": s3.proxy.url, "key": "testing", "secret": "testing",
               "client_kwargs": {"region_name": "us-east-1"}}
    pack(trees["generic"], s3.url, options=OPTIONS, engine="dask", scheduler=cluster,
         remote=RemoteOptions(storage_options=storage))
    local = pack(trees["generic"], tmp_path / "local", options=OPTIONS, num_workers=2)
    store = open_store(s3.url)
    objects = {name: store.read_bytes(name) for name in store.list_names()}
    assert objects == _files(tmp_path / "local") and local.shards >= 8


def test_a_worker_that_does_not_see_src_or_out_refuses_to_walk_or_build(tmp_path: Path) -> None:
    from shardio.packing.build import ShardJob
    from shardio.packing.engines.dasktasks import build_task, walk_task_paused
    from shardio.packing.scan import WalkSpec

    gone = str(tmp_path / "not-mounted")
    with pytest.raises(PackError, match="not a folder on the Dask worker"):
        walk_task_paused(WalkSpec(gone, gone + "/"), [(gone + "/a", "a/", frozenset())], 8)
    job = ShardJob((), {0: range(0)}, tmp_path / "out", "records", "none", 3, False, False,
                   False)
    for src in (gone, str(tmp_path)):  # SRC missing; then OUT missing
        with pytest.raises(PackError, match="SRC and a local OUT at the same path"):
            build_task(job, b"\x90", 0, None, "run", src)


IMPORTS = """
import sys, shardio
shardio.pack(sys.argv[1], sys.argv[2], num_workers=2)
print(sorted({m.split(".")[0] for m in sys.modules} & {"dask", "distributed"}))
import shardio.packing.engines.dask
print(sorted({m.split(".")[0] for m in sys.modules} & {"dask", "distributed"}))
"""


def test_import_shardio_and_a_local_pack_never_import_dask(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    done = subprocess.run([sys.executable, "-c", IMPORTS, str(trees["generic"]),
                           str(tmp_path / "out")], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "['dask', 'distributed']"]  # the check works


def test_without_dask_the_engine_names_the_extra(trees: dict[str, Path], tmp_path: Path) -> None:
    code = ("import sys; sys.modules['distributed'] = sys.modules['dask'] = None\n"
            "import shardio\n"
            "try:\n    shardio.pack(sys.argv[1], sys.argv[2], engine='dask')\n"
            "except shardio.ShardioError as exc:\n    print(type(exc).__name__, exc)")
    done = subprocess.run([sys.executable, "-c", code, str(trees["generic"]),
                           str(tmp_path / "out")], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("MissingDependencyError")
    assert "pip install 'dask[distributed]'" in done.stdout and not (tmp_path / "out").exists()
