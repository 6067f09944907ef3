"""A plain ``DataLoader`` over a remote ``StreamingDataset(batch_size=B)``: the records of
its first batch, exactly ``B`` samples, are what is read on its own ahead of the ranges.

The stream's default head is 64 samples; a dataset that knows its loader's batch size
reads that many instead: fewer bytes twice for a small batch, no wait on whole ranges for
the rest of a large one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from storage_servers import S3Endpoint
from test_remote_head import (  # noqa: F401  (packed: a fixture, found by name)
    NUM,
    _joined,
    _options,
    _planned_spans,
    _record_span,
    _spans,
    _upload,
    packed,
)

import shardio
from shardio.reading.reader import DatasetReader

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers


@pytest.mark.parametrize("batch_size", [3, 10])
def test_a_plain_dataloaders_first_batch_is_the_head(
        batch_size: int, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:  # noqa: F811
    _upload(packed, s3.url)
    # plan blocks of 2: the first window yields 2 samples of one block, then 4 of 2 blocks
    # (``head_first``), so a first batch wants records of several ranges
    ds = shardio.StreamingDataset(s3.url, decode="raw", shuffle_buffer=NUM, block_size=2,
                                  seed=3, batch_size=batch_size, remote=_options(tmp_path))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=0,
                                         collate_fn=list)
    batches = [[sample["__key__"] for sample in batch] for batch in loader]
    keys = Counter(key for batch in batches for key in batch)
    assert len(keys) == NUM and set(keys.values()) == {1}

    local = DatasetReader(packed)
    whole, tails = _planned_spans(local, block=2)
    exact = _spans(tmp_path / "cache") - whole - tails
    # the first batch's records on their own, and no other sample's (64 without batch_size)
    assert exact == set(_joined([_record_span(local, int(key[1:])) for key in batches[0]]))
    local.close()
