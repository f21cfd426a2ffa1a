"""Text inputs (issue 11): a WordLevel tokenizer trained here on a few sentences and saved as tokenizer.json, a
``tokenize`` step feeding a model's two named inputs (ids and attention mask), run in PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from mlms_nb.data.transforms import Preprocessor  # noqa: E402
from mlms_nb.evaluation.inputs import LoadedInputs  # noqa: E402
from mlms_nb.evaluation.outputs import OutputRecorder, outputs_pass  # noqa: E402
from mlms_nb.frameworks import open_predictor  # noqa: E402
from mlms_nb.manifest import parse_manifest  # noqa: E402

SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the model reads short sentences",
             "frameworks agree on the outputs"]
LENGTH = 8


class BagOfWords(torch.nn.Module):
    """Mean of the token embeddings under the attention mask, then two scores."""

    def __init__(self, vocabulary: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocabulary, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        mean = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(mean)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    path = tmp_path_factory.mktemp("text") / "tokenizer.json"
    tokenizer.save(str(path))
    return path, tokenizer.get_vocab_size()


def test_a_tokenizer_file_feeds_two_named_inputs(tokenizer_file):
    path, vocabulary = tokenizer_file
    torch.manual_seed(0)
    module = BagOfWords(vocabulary).eval()
    manifest = parse_manifest({
        "name": "bag", "framework": {"name": "torch"},
        "inputs": [{"name": "input_ids", "type": "text", "dimensions": [LENGTH], "dtype": "int64"},
                   {"name": "attention_mask", "type": "tensor", "dimensions": [LENGTH], "dtype": "int64"}],
        "outputs": [{"name": "scores", "type": "tensor"}],
        "preprocess": [{"tokenize": {"tokenizer": path.name, "max_length": LENGTH,
                                     "attention_mask": "attention_mask"}}],
        "model": {"instance": module}}, source=str(path.parent / "bag.yaml"))
    preprocess = Preprocessor(manifest)
    items = [preprocess(text) for text in [*SENTENCES, "the unseen zebra"]]
    first = items[0]
    assert set(first) == {"input_ids", "attention_mask"} and first["input_ids"].dtype == np.int64
    assert first["attention_mask"].tolist() == [1] * 6 + [0] * 2  # six words, padded to eight
    assert items[-1]["input_ids"][2] == 1  # "zebra" is [UNK]

    ids = [f"s{i}" for i in range(len(items))]
    inputs = LoadedInputs("dense", {k: np.stack([item[k] for item in items]) for k in first}, ids)
    recorder = OutputRecorder(manifest, "torch", "all")
    with open_predictor(manifest) as predictor:
        outputs_pass(predictor.predict, manifest, inputs, recorder, batch_size=2)
        timed = predictor.predict(inputs.batch(3))  # a timed loop's batch: mappings cycle like arrays
    assert set(timed) == {"scores"} and timed["scores"].shape == (3, 2)
    frame = recorder.frame()
    assert list(frame["input_id"]) == ids
    got = np.stack(frame["values"].map(np.asarray))
    with torch.no_grad():
        expected = module(torch.from_numpy(inputs.data["input_ids"]), torch.from_numpy(inputs.data["attention_mask"]))
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-6)
    # the mask matters: padding positions do not change the scores
    padded = dict(first, input_ids=np.where(first["attention_mask"] == 1, first["input_ids"], 3))
    with open_predictor(manifest) as predictor:
        again = predictor.predict({k: v[None] for k, v in padded.items()})["scores"]
    np.testing.assert_allclose(again[0], got[0], atol=1e-6)
