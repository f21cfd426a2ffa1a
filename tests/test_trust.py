"""The trust model (issue 12 item 1): model files that can run code run only when trusted, per run or per asset.

The hostile files are built here: a TorchScript program whose forward writes a file through
``torch.from_file(..., shared=True)`` and a SavedModel whose serving function runs ``tf.io.write_file``.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import mlms_nb
from mlms_nb import cli
from mlms_nb.errors import UntrustedError
from mlms_nb.frameworks import PredictorOptions, open_predictor
from mlms_nb.manifest import load_manifest

torch = pytest.importorskip("torch")

RUN = dict(dataset="synthetic:2", batch_sizes=[1], warmup=1, min_repeats=2, min_time_s=0.01, progress=False,
           history=False)


def _manifest(folder: Path, framework: str, graph: str, dims=(3, 8, 8), layout="NCHW") -> Path:
    path = folder / f"{framework}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: hostile
        framework: {{name: {framework}}}
        inputs: [{{type: tensor, layout: {layout}, dimensions: {list(dims)}}}]
        outputs: [{{type: tensor}}]
        model: {{graph_path: {graph}}}
        """))
    return path


def _torchscript(folder: Path, target: Path, marker: int = 65) -> Path:
    class Writes(torch.nn.Module):
        def __init__(self, target: str, marker: int):
            super().__init__()
            self.target = target
            self.marker = marker

        def forward(self, x):
            written = torch.from_file(self.target, shared=True, size=8, dtype=torch.uint8)
            written.fill_(self.marker)
            return x.flatten(1)[:, :4] + written[0].to(torch.float32) * 0.0  # used, so not optimised away

    path = folder / "writes.pt"
    torch.jit.script(Writes(str(target), marker)).save(str(path))
    return path


def _open(manifest_path: Path, trust: bool = False):
    manifest = load_manifest(manifest_path)
    return open_predictor(manifest, options=PredictorOptions(trust=trust))


def test_torchscript_runs_only_when_trusted(tmp_path, mlms_home):
    target = tmp_path / "written_by_torchscript"
    graph = _torchscript(tmp_path, target)
    manifest = _manifest(tmp_path, "torch", graph.name)

    with pytest.raises(UntrustedError) as refused:
        mlms_nb.evaluate(str(manifest), **RUN)
    message = str(refused.value)
    assert str(graph.resolve()) in message and "TorchScript" in message and "mlms trust add" in message
    assert "\n" not in message
    with pytest.raises(UntrustedError):  # the predictor itself refuses too, whoever opens it
        _open(manifest)
    assert not target.exists()

    evaluation = mlms_nb.evaluate(str(manifest), trust=True, **RUN)  # trusted for this run
    assert target.read_bytes() == b"A" * 8 and evaluation.complete
    target.unlink()

    assert mlms_nb.trust_add(graph)["path"].tolist() == [str(graph.resolve())]  # trusted in the store
    mlms_nb.evaluate(str(manifest), **RUN)
    assert target.read_bytes() == b"A" * 8
    target.unlink()

    _torchscript(tmp_path, target, marker=66)  # the file changes: its pinned sha256 no longer matches
    with pytest.raises(UntrustedError, match="changed since it was trusted"):
        mlms_nb.evaluate(str(manifest), **RUN)
    assert not target.exists()
    mlms_nb.trust_remove(graph)
    assert mlms_nb.trust_list().empty


def test_savedmodel_runs_only_when_trusted(tmp_path, mlms_home):
    tf = pytest.importorskip("tensorflow")
    target = tmp_path / "written_by_savedmodel"

    class Writes(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 3], tf.float32)])
        def serve(self, x):
            tf.io.write_file(str(target), "SavedModel graph op WriteFile ran")
            return {"out": tf.reshape(x, [-1, 48])[:, :4]}

    module = Writes()
    folder = tmp_path / "saved"
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})
    manifest = _manifest(tmp_path, "tensorflow", "saved", dims=(4, 4, 3), layout="NHWC")

    with pytest.raises(UntrustedError) as refused:
        mlms_nb.evaluate(str(manifest), **RUN)
    assert str(folder.resolve()) in str(refused.value) and "SavedModel" in str(refused.value)
    with pytest.raises(UntrustedError):
        _open(manifest)
    assert not target.exists()

    mlms_nb.evaluate(str(manifest), trust=True, **RUN)
    assert target.read_text() == "SavedModel graph op WriteFile ran"
    target.unlink()

    assert cli.main(["trust", "add", str(folder)]) == 0  # the CLI's store is the same store
    mlms_nb.evaluate(str(manifest), **RUN)
    assert target.exists()
    target.unlink()

    (folder / "assets").mkdir(exist_ok=True)
    (folder / "assets" / "extra.txt").write_text("a changed folder")
    with pytest.raises(UntrustedError, match="changed since it was trusted"):
        mlms_nb.evaluate(str(manifest), **RUN)
    assert not target.exists()


def test_trust_verbs(tmp_path, mlms_home, capsys):
    asset = tmp_path / "model.pt"
    asset.write_bytes(b"not yet a model")
    assert cli.main(["trust", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trusted"] == []
    assert cli.main(["trust", "add", str(asset)]) == 0
    assert str(asset.resolve()) in capsys.readouterr().out
    store = json.loads((mlms_home / "trust.json").read_text())["trusted"]
    assert len(store) == 1 and len(store[0]["sha256"]) == 64
    assert cli.main(["trust", "remove", store[0]["sha256"][:12]]) == 0
    assert cli.main(["trust", "remove", str(asset)]) == 2  # nothing left to remove: one sentence, exit 2
    assert "not in the trust store" in capsys.readouterr().err
    assert cli.main(["trust", "add", str(tmp_path / "missing.pt")]) == 2


def test_code_steps_and_builtins(tmp_path, mlms_home):
    """A manifest file with code steps is trusted by its sha256 like a model file; built-in manifests are trusted."""
    from mlms_nb.frameworks.live import check_trust
    from mlms_nb.trust import is_trusted

    assert is_trusted(mlms_nb.find_manifest("resnet50", framework="torch").source)
    manifest = _manifest(tmp_path, "onnxruntime", "model.onnx")
    manifest.write_text(manifest.read_text() + "postprocess:\n  - code: {source: 'def process(x): return x'}\n")
    with pytest.raises(UntrustedError, match="code steps") as refused:
        mlms_nb.evaluate(str(manifest), **RUN)
    assert str(manifest.resolve()) in str(refused.value)
    mlms_nb.trust_add(manifest)
    check_trust(load_manifest(manifest), trust=False)  # no refusal once the file is trusted
    manifest.write_text(manifest.read_text() + "description: changed\n")
    with pytest.raises(UntrustedError, match="changed since"):
        check_trust(load_manifest(manifest), trust=False)


def test_own_conversions_are_trusted_by_their_checksum(mlms_home):
    """An artifact mlms-nb built (artifact.json beside it records its sha256) is trusted; a changed one is not."""
    from mlms_nb.paths import artifacts_dir
    from mlms_nb.trust import asset_digest, is_trusted

    folder = artifacts_dir() / "m" / "1.0.0" / "tensorflow"
    saved = folder / "saved_model"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"graph")
    (saved / "variables" / "variables.index").write_bytes(b"index")
    (folder / "artifact.json").write_text(json.dumps({"file": "saved_model", "sha256": asset_digest(saved)}))
    assert is_trusted(saved)
    (saved / "saved_model.pb").write_bytes(b"another graph")
    assert not is_trusted(saved)
    elsewhere = mlms_home / "copy.pt"  # outside the artifacts folder an artifact.json proves nothing
    elsewhere.write_bytes(b"x")
    (mlms_home / "artifact.json").write_text(json.dumps({"sha256": asset_digest(elsewhere)}))
    assert not is_trusted(elsewhere)
