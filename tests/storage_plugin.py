"""Fixtures of the storage tests: an S3 API and an HTTP server on loopback, behind a fault proxy.

Registered by the storage test modules (``pytest_plugins``). The moto server
and its proxy live for the session; each test gets a fresh bucket, the proxy's
faults switched off, and an ``AWS_*`` environment that points at the proxy and
at nothing of the user's (no profile, no credentials file, no instance metadata),
which child processes inherit.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_servers import FaultProxy, HttpEndpoint, MotoS3, RangeHTTPServer, S3Endpoint


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 for the whole session."""
    server = MotoS3()
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3_proxy(moto_s3: MotoS3) -> Iterator[FaultProxy]:
    """The fault proxy in front of moto, for the whole session."""
    proxy = FaultProxy(moto_s3.address)
    yield proxy
    proxy.close()


@pytest.fixture
def s3(moto_s3: MotoS3, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch,
       tmp_path: Path) -> S3Endpoint:
    """A fresh bucket through the proxy (no faults yet); ``AWS_*`` points there."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_proxy.url,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }.items():
        monkeypatch.setenv(name, value)
    bucket = f"shardio-{uuid.uuid4().hex[:12]}"
    moto_s3.create_bucket(bucket)
    s3_proxy.plan.reset()
    return S3Endpoint(f"s3://{bucket}/data", bucket, s3_proxy.plan, moto_s3, s3_proxy)


@pytest.fixture
def http(tmp_path: Path) -> Iterator[HttpEndpoint]:
    """``tmp_path/served`` over HTTP with Range, behind a fault proxy (no faults yet)."""
    root = tmp_path / "served"
    root.mkdir()
    server = RangeHTTPServer(root)
    proxy = FaultProxy(server.address)
    yield HttpEndpoint(root, proxy.url, proxy.plan, server)
    proxy.close()
    server.close()
