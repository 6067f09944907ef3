"""S3 ranged GETs by presigned URL: one signature per object, renewed, and get_object where not."""

from __future__ import annotations

import os
from typing import Any

import pytest
from storage_servers import FAST_RETRY, S3Endpoint

from shardio.storage import RemoteStore, open_store, presigned

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

DATA = os.urandom(1 << 20)


def _store(s3: S3Endpoint) -> tuple[RemoteStore, Any]:
    store = open_store(s3.url, retry=FAST_RETRY)
    assert isinstance(store, RemoteStore)
    store.put_bytes("a.rec", DATA)
    store.put_bytes("b.rec", DATA[::-1])
    return store, store._fs()


def test_ranges_of_one_object_share_one_presigned_url(s3: S3Endpoint) -> None:
    store, fs = _store(s3)
    s3.plan.reset()
    for start in (0, 1000, 500_000):
        assert store.read_range("a.rec", start, start + 4096) == DATA[start:start + 4096]
    assert store.read_range("b.rec", 7, 99) == DATA[::-1][7:99]
    urls = fs._shardio_presigned.urls
    assert len(urls) == 2 and all("X-Amz-Signature=" in url for url, _ in urls.values())
    assert (s3.plan.gets, s3.plan.ranged_gets) == (4, 4)  # signing asks the store nothing


def test_a_url_past_half_its_life_is_signed_again(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    store, fs = _store(s3)
    store.read_range("a.rec", 0, 10)
    state = fs._shardio_presigned
    (key, _known), = state.urls.items()
    state.urls[key] = ("http://127.0.0.1:9/never-used", 0.0)  # due for renewal: not used
    assert store.read_range("a.rec", 10, 20) == DATA[10:20]
    assert state.urls[key][1] > 0 and state.urls[key][0] != "http://127.0.0.1:9/never-used"


def test_where_no_url_can_be_signed_get_object_reads(s3: S3Endpoint,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store, _fs = _store(s3)

    async def refuse(*_args: Any, **_kwargs: Any) -> str:
        raise presigned.CannotPresign("no credentials, say")

    monkeypatch.setattr(presigned, "_url", refuse)
    s3.plan.reset(cut_every=1)  # and its faults are retried as before
    assert store.read_range("a.rec", 100, 500_000) == DATA[100:500_000]
    assert s3.plan.cuts >= 1 and store.stats.resumed >= 1


@pytest.mark.parametrize("status", [400, 301])
def test_a_refused_presigned_get_sends_the_filesystem_to_get_object(
        s3: S3Endpoint, status: int) -> None:
    """A store without query-string authentication, or a bucket of another region."""
    store, fs = _store(s3)
    s3.plan.reset(refuse_match="X-Amz-Signature=", refuse_status=status)
    assert store.read_range("a.rec", 3, 30) == DATA[3:30]
    assert store.read_range("a.rec", 30, 60) == DATA[30:60]
    assert s3.plan.refusals == 1 and s3.plan.ranged_gets == 2  # refused once, then get_object
    assert not presigned.usable(fs)


def test_403_signs_again_once_then_is_access_denied(s3: S3Endpoint) -> None:
    from shardio.errors import StorageError

    store, fs = _store(s3)
    store.read_range("a.rec", 0, 1)
    s3.plan.reset(refuse_match="X-Amz-Signature=", refuse_status=403)
    with pytest.raises(StorageError, match="access denied"):
        store.read_range("a.rec", 0, 10)
    assert s3.plan.refusals == 2  # the cached URL, then one signed anew; never retried more
    s3.plan.reset()
    assert store.read_range("a.rec", 0, 10) == DATA[:10]  # credentials fine again: presigned
    assert presigned.usable(fs)


def test_an_error_names_the_object_never_the_url_that_grants_a_read(s3: S3Endpoint) -> None:
    from shardio.errors import StorageError

    store, _fs = _store(s3)
    s3.plan.reset(refuse_match="X-Amz-Signature=", refuse_status=418)
    with pytest.raises(StorageError, match=r"a\.rec") as caught:
        store.read_range("a.rec", 0, 10)
    assert "418" in str(caught.value) and "Signature" not in str(caught.value)
    assert s3.plan.refusals == 1  # a 4xx is not retried
    s3.plan.reset(refuse_match="X-Amz-Signature=", refuse_status=500)
    with pytest.raises(StorageError) as caught:
        store.read_range("a.rec", 0, 10)
    assert s3.plan.refusals == FAST_RETRY.max_attempts  # a 5xx is, to the policy's end
    assert "Signature" not in str(caught.value)


def test_customer_key_encryption_is_not_presigned() -> None:
    class Fs:
        def __init__(self) -> None:
            self.req_kw = {"SSECustomerKey": "k", "SSECustomerAlgorithm": "AES256"}
            self.loop = None

    assert not presigned.usable(Fs())


def test_a_missing_object_is_file_not_found(s3: S3Endpoint) -> None:
    store, _fs = _store(s3)
    with pytest.raises(FileNotFoundError):
        store.read_range("nope.rec", 0, 10)
