"""A remote mistake through the CLI ends in one ``Error:`` line that names the URL (never its
query string or a secret), what failed and what to set or check, with exit status 1 and
no traceback unless ``--debug`` or ``SHARDIO_DEBUG=1`` asks for one.

Every server is on 127.0.0.1: moto's S3 (``storage_plugin``), a server answering 403 to
everything, and a port nothing listens on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from storage_servers import S3Endpoint

from benchmarks.storage_proxy import Server, serve

pytest_plugins = ["storage_plugin"]

pytestmark = pytest.mark.servers

SECRET = "wJalrXUtnFEMI-not-a-real-secret"


def shardio(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardio", *args], capture_output=True,
                          text=True, timeout=180, env=env)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single ``Error:`` line of a failed command, which printed nothing else."""
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


class _Forbidden(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _refuse(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
                b"<Message>Access Denied</Message></Error>")
        self.send_response(403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _refuse


@pytest.fixture
def forbidden() -> Iterator[str]:
    """The URL of a loopback server that answers 403 Access Denied to every request."""
    server = Server(("127.0.0.1", 0), _Forbidden)
    thread = serve(server, "forbidden")
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_packing_to_a_missing_bucket_names_the_bucket_and_the_endpoint(
    tmp_path: Path, s3: S3Endpoint,
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"a")
    line = one_error_line(shardio("pack", str(tmp_path / "src"), "s3://no-such-bucket-x/train"))
    assert line.startswith("Error: s3://no-such-bucket-x/train: LIST: ")
    assert "the bucket 'no-such-bucket-x' does not exist" in line
    assert f"at the endpoint {s3.proxy.url} (AWS_ENDPOINT_URL)" in line
    assert "no such object" not in line
    read = one_error_line(shardio("ls", "s3://no-such-bucket-x/train"))
    assert "the bucket 'no-such-bucket-x' does not exist" in read and "no manifest" not in read


def test_missing_credentials_say_which_variables_to_set(
    tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        (tmp_path / name).write_text("")
        monkeypatch.setenv(name, str(tmp_path / name))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"a")
    for args in (("pack", str(tmp_path / "src"), s3.url), ("info", s3.url)):
        line = one_error_line(shardio(*args))
        assert line.startswith(f"Error: {s3.url}")
        assert "no credentials were found" in line
        for hint in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                     "RemoteOptions(storage_options=", "'anon': True"):
            assert hint in line


def test_a_403_is_access_denied_with_what_to_check_and_no_secret(
    forbidden: str, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", forbidden)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    line = one_error_line(shardio("info", "s3://some-bucket/train"))
    assert line.startswith("Error: s3://some-bucket/train/manifest.json: GET: access denied")
    assert f"by the endpoint {forbidden} (AWS_ENDPOINT_URL)" in line
    assert "AWS_ACCESS_KEY_ID" in line and "RemoteOptions(storage_options=" in line
    assert SECRET not in line
    signed = one_error_line(shardio("info", f"{forbidden}/train?X-Amz-Signature={SECRET}"))
    assert signed.startswith(f"Error: {forbidden}/train")
    assert "access denied (ClientResponseError: HTTP 403 Forbidden)" in signed
    assert "'headers'" in signed and SECRET not in signed and "?" not in signed
    assert "ClientResponseError(" not in signed and "RequestInfo" not in signed


def test_debug_prints_the_traceback_behind_the_error_line(forbidden: str) -> None:
    quiet = one_error_line(shardio("info", f"{forbidden}/train"))
    for debug in (["--debug"], []):
        env = None if debug else {**os.environ, "SHARDIO_DEBUG": "1"}
        loud = shardio(*debug, "info", f"{forbidden}/train", env=env)
        assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr
        assert "StorageError" in loud.stderr
        assert loud.stderr.strip().splitlines()[-1] == quiet


def test_an_unexpected_error_is_one_line_that_says_how_to_see_it() -> None:
    broken = ("import sys, shardio.storage.location as location\n"
              "def read_manifest(*args, **kwargs): raise RuntimeError('a bug in the reader')\n"
              "location.read_manifest = read_manifest\n"
              "import shardio.cli.inspect as inspect\n"
              "inspect.read_manifest = read_manifest\n"
              "from shardio.cli import main\n"
              "main(sys.argv[1:], prog_name='shardio')\n")
    run = [sys.executable, "-c", broken]
    quiet = subprocess.run([*run, "info", "x"], capture_output=True, text=True, timeout=120)
    line = one_error_line(quiet)
    assert "RuntimeError: a bug in the reader" in line and "--debug" in line
    loud = subprocess.run([*run, "--debug", "info", "x"], capture_output=True, text=True,
                          timeout=120)
    assert loud.returncode == 1 and "Traceback" in loud.stderr
    assert "RuntimeError: a bug in the reader" in loud.stderr


def test_an_ftp_dataset_gets_its_host_from_the_url() -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    line = one_error_line(shardio("info", f"ftp://127.0.0.1:{port}/train"))
    assert line.startswith(f"Error: ftp://127.0.0.1:{port}/train/manifest.json: GET: ")
    assert "Connection refused" in line and "host" not in line
