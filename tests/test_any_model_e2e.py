"""Must-show of issue 10: a small real CNN of the test's own (tests/data/byom_cnn.py, not in the zoo), described by an
entrypoint manifest with a state_dict, run through the public API in torch, onnxruntime and tensorflow (the last two
are the kept converters' copies): the same top-1 and logits within 1e-4, a FRAMEWORK-level trace with layer spans in
each, and a `diverge` report whose layers are all aligned and none divergent. (Refusal without trust: test_byom.py.)

One module-scoped evaluation and one divergence, on 4 real photos at 32x32 px, shared by the assertions.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("keras")

import mlms_nb  # noqa: E402
from tests.data.byom_cnn import seeded  # noqa: E402

FRAMEWORKS = ["torch", "onnxruntime", "tensorflow"]
CLASSES = [f"class_{i}" for i in range(10)]


@pytest.fixture(scope="module")
def manifest_path(tmp_path_factory):
    """The entrypoint manifest, its state_dict (``torch.save``) and a 10-class label file, in a folder of their own."""
    root = tmp_path_factory.mktemp("any_model")
    torch.save(seeded().state_dict(), root / "small_cnn.pth")
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    path = root / "small_cnn.yaml"
    path.write_text(textwrap.dedent("""\
        name: small_cnn
        framework: {name: torch}
        inputs:
          - {type: image, layout: NCHW, dimensions: [3, 32, 32], mean: [123.675, 116.28, 103.53],
             scale: [58.395, 57.12, 57.375]}
        outputs:
          - {type: classification, classes: 10, labels: classes.txt}
        model:
          entrypoint: "tests.data.byom_cnn:SmallCNN"
          entrypoint_args: {classes: 10}
          weights_path: small_cnn.pth
        """))
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(tmp_path_factory.mktemp("home")))
        yield


@pytest.fixture(scope="module")
def evaluation(manifest_path, home):
    threads = torch.get_num_threads()
    try:  # one intra-op thread: on 2 busy cores more threads mostly spin-wait, burning CPU the suite needs
        return mlms_nb.evaluate(str(manifest_path), framework=",".join(FRAMEWORKS), trust=True, limit=4,
                                batch_sizes=[1], warmup=1, min_repeats=2, min_time_s=0.01, threads=1,
                                trace_level="FRAMEWORK", trace_repeats=1, keep_probabilities=True, progress=False,
                                history=False)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def divergence(manifest_path, home, evaluation):  # after the evaluation: the converted copies are reused
    return mlms_nb.diverge(str(manifest_path), frameworks=",".join(FRAMEWORKS), trust=True, limit=4, batch_size=4,
                           latency_repeats=2)


def test_same_top1_and_logits_in_three_frameworks(evaluation):
    assert evaluation.complete and evaluation.frameworks == FRAMEWORKS
    probabilities = evaluation.probabilities
    reference = probabilities["torch"]
    assert reference.shape == (4, 10)
    for fw in FRAMEWORKS[1:]:
        np.testing.assert_allclose(probabilities[fw], reference, atol=1e-5, err_msg=fw)
    top1 = evaluation.predictions.pivot(index="input_id", columns="framework", values="top1_name")
    assert (top1[FRAMEWORKS].nunique(axis=1) == 1).all()  # the same top-1 class in all three, input by input
    assert set(top1["torch"]) <= set(CLASSES)  # named by the test's own 10-class label file
    assert reference.argmax(1).tolist() != [reference.argmax(1)[0]] * 4  # the class differs between inputs


def test_a_framework_level_trace_with_layer_spans_in_each(evaluation):
    for fw in FRAMEWORKS:
        spans = evaluation.traces[fw].spans
        layers = spans[spans["kind"] == "layer"]
        assert len(layers) >= 5, fw  # convolutions, pooling, the head: layers, not one span for the model
        assert (layers["level"] == "FRAMEWORK").all(), fw


def test_diverge_aligns_every_layer_and_none_diverges(divergence):
    d = divergence
    assert d.frameworks == FRAMEWORKS
    errors = d.layers.filter(like="max_rel_error")
    assert errors.shape[1] == 3 and len(errors) >= 5
    assert errors.notna().all().all()  # every layer is present in all three frameworks compared
    assert (errors.to_numpy() <= 1e-4).all()
    assert set(d.first_divergent_layer.values()) == {None}
    assert (d.outputs["top1_agreement"] == 1.0).all() and (d.outputs["max_abs_logit_error"] <= 1e-4).all()
    # ONNX Runtime ran its optimised graph (Conv + ReLU fused): the fused nodes' time is on the rows of the layers
    # they stand for, and the report says so
    assert d.layers["latency_ms[onnxruntime]"].notna().all()
    assert "fused nodes per call" in d.notes["latency onnxruntime"]
