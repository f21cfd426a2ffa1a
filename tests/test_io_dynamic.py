"""Dynamic input sizes (issue 11): a small fully convolutional "detection" net with ``dimensions: [3, null, null]``
and an aspect-preserving resize rounded to multiples of 32 runs, in PyTorch and ONNX Runtime, over one folder of
real photos of different sizes (the imagenet-samples photos, cropped here to different aspect ratios); its mask
outputs are captured per photo and compared across the two frameworks (IoU)."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from PIL import Image

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import mlms_nb  # noqa: E402
from mlms_nb.data.datasets import ImageNetSamples  # noqa: E402
from mlms_nb.data.transforms import fit_size  # noqa: E402
from mlms_nb.manifest import ResizeFitArgs  # noqa: E402

RATIOS = [(1, 1), (4, 3), (3, 4), (16, 9), (9, 16), (2, 1), (1, 2), (5, 4), (4, 5), (3, 2)]
FIT = {"long_side": 128, "multiple_of": 32}


class MaskNet(torch.nn.Module):
    """Fully convolutional: a stride-2 conv, then a per-pixel score in 0..1 (a mask at half resolution)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.score = torch.nn.Conv2d(4, 1, 1)

    def forward(self, image):
        return torch.sigmoid(self.score(torch.relu(self.features(image))))


def build_masknet() -> MaskNet:
    return MaskNet()


def _manifest(framework: str, model: dict) -> dict:
    return {"name": "masknet", "framework": {"name": framework},
            "inputs": [{"name": "image", "type": "image", "dimensions": [3, None, None], "mean": [127.5],
                        "scale": [127.5]}],
            "outputs": [{"name": "mask", "type": "tensor", "metrics": ["iou"]}],
            "preprocess": [{"decode": {"color_mode": "RGB"}}, {"resize_fit": FIT},
                           {"normalize": {"mean": [127.5], "scale": [127.5]}}, {"to_layout": {"layout": "NCHW"}}],
            "model": model}


@pytest.fixture(scope="module")
def masknet_folder(tmp_path_factory):
    """The model's weights, ONNX export (dynamic H and W) and manifests, and a folder of the 20 photos cropped
    to ten aspect ratios."""
    folder = tmp_path_factory.mktemp("masknet")
    torch.manual_seed(0)
    module = MaskNet().eval()
    torch.save(module.state_dict(), folder / "masknet.pth")
    torch.onnx.export(module, (torch.zeros(1, 3, 64, 96),), str(folder / "masknet.onnx"), input_names=["image"],
                      output_names=["mask"], dynamic_axes={"image": {0: "n", 2: "h", 3: "w"}}, dynamo=False)
    (folder / "torch.yaml").write_text(yaml.safe_dump(_manifest(
        "torch", {"entrypoint": "tests.test_io_dynamic:build_masknet", "weights_path": "masknet.pth"})))
    (folder / "onnxruntime.yaml").write_text(yaml.safe_dump(_manifest("onnxruntime", {"graph_path": "masknet.onnx"})))
    photos = tmp_path_factory.mktemp("photos")
    sizes = {}
    for i, (_, _, path) in enumerate(ImageNetSamples.locate()):
        rw, rh = RATIOS[i % len(RATIOS)]
        with Image.open(path) as img:
            w, h = img.size
            scale = min(w / rw, h / rh)
            crop = img.crop((0, 0, int(rw * scale), int(rh * scale))).convert("RGB")
        crop.save(photos / f"photo_{i:02d}.png")
        sizes[f"photo_{i:02d}.png"] = crop.size
    return {"folder": folder, "photos": photos, "sizes": sizes}


def test_photos_of_different_sizes_run_in_one_dataset(masknet_folder, mlms_home, monkeypatch):
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(masknet_folder["folder"]))
    ev = mlms_nb.evaluate("masknet", framework="torch,onnxruntime", trust=True, dataset=str(masknet_folder["photos"]),
                          batch_sizes=[2], capture_outputs="all", trace_level="MODEL", trace_repeats=2, warmup=1,
                          min_repeats=3, min_time_s=0, progress=False, history=False)
    assert ev.complete, ev.missing()
    outputs = ev.outputs
    assert len(outputs) == 2 * 20 and set(outputs["output"]) == {"mask"}
    torch_rows = outputs[outputs["framework"] == "torch"].set_index("input_id")
    shapes = {tuple(s) for s in torch_rows["shape"]}
    assert len(shapes) >= 3  # photos of different aspect ratios give masks of different sizes
    for input_id, (w, h) in masknet_folder["sizes"].items():
        fit_h, fit_w = fit_size((w, h), ResizeFitArgs(**FIT))
        assert fit_h % 32 == 0 and fit_w % 32 == 0 and max(fit_h, fit_w) <= 128 + 16
        assert tuple(torch_rows.loc[input_id, "shape"]) == (1, fit_h // 2, fit_w // 2)
        assert 0 <= torch_rows.loc[input_id, "min"] <= torch_rows.loc[input_id, "max"] <= 1
    agreement = ev.output_agreement.set_index("metric")["value"]
    assert agreement["iou"] > 0.99 and agreement["max_abs_error"] < 1e-4
    assert set(ev.latency["framework"]) == {"torch", "onnxruntime"}  # timed on the first photo's size
    assert ev.predictions.empty and ev.accuracy.empty  # a tensor output: nothing to classify
    spans = ev.trace.spans
    assert (spans["name"] == "predict").sum() >= 2
    assert not (spans["name"] == "postprocess").any()  # no softmax/top-5 of a mask in the traced pass
    assert "Output agreement: onnxruntime vs torch, mask: max_abs_error" in ev.to_text()


def test_a_size_against_the_dimensions_is_named(masknet_folder):
    from mlms_nb.data.feeds import FeedError
    from mlms_nb.frameworks import open_predictor
    from mlms_nb.manifest import parse_manifest

    data = _manifest("onnxruntime", {"graph_path": "masknet.onnx"})
    data["inputs"][0]["dimensions"] = [3, "H", "H"]  # square images only
    manifest = parse_manifest(data, source=str(masknet_folder["folder"] / "square.yaml"))
    with open_predictor(manifest) as predictor:
        assert predictor.predict(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 1, 16, 16)
        with pytest.raises(FeedError, match=r"input 'image' dimension 2 \(H\) is 64 but H is 32 at 'image' "
                                            r"dimension 1; one call gives one size to H"):
            predictor.predict(np.zeros((1, 3, 32, 64), np.float32))
        with pytest.raises(FeedError, match=r"input 'image' dimension 0 is 1 but the manifest says 3"):
            predictor.predict(np.zeros((1, 1, 32, 32), np.float32))
