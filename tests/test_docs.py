"""The docs stay true: the manifest reference matches the schema, and the guides' Python blocks run."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_manifest_reference_is_generated_from_the_schema():
    spec = importlib.util.spec_from_file_location("gen_manifest_reference", REPO / "scripts" / "gen_manifest_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.render()
    assert (DOCS / "manifest-reference.md").read_text(encoding="utf-8") == text, \
        "docs/manifest-reference.md drifted from the schema: run python scripts/gen_manifest_reference.py"
    from mlms_nb.manifest import ModelSpec

    for name in ModelSpec.model_fields:  # every field is documented
        if name != "instance":
            assert f"| `{name}` |" in text


def test_readme_links_the_docs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in ("docs/trust.md", "docs/byom.md", "docs/manifest-reference.md"):
        assert page in readme and (REPO / page).exists()


def test_trust_guide_runs(tmp_path, mlms_home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for block in _python_blocks(DOCS / "trust.md"):
        exec(compile(block, "docs/trust.md", "exec"), {"__name__": "docs_trust"})  # noqa: S102 - our own docs


@pytest.mark.slow  # ~15 s: it exports the model in five formats and evaluates each (TensorFlow and torch.export)
def test_byom_guide_runs(tmp_path, mlms_home, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks(DOCS / "byom.md")
    assert len(blocks) >= 6
    namespace = {"__name__": "docs_byom"}
    path = list(sys.path)
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/byom.md python block {i + 1}", "exec"), namespace)  # noqa: S102
    finally:
        sys.path[:] = path
        sys.modules.pop("mynet", None)
    # the four ways in ran on the same photos and the files agree with the live module
    import numpy as np

    live, onnx_ev, ts_ev = namespace["live"], namespace["onnx_ev"], namespace["ts_ev"]
    assert list(live.predictions["top1"]) == list(onnx_ev.predictions["top1"]) == list(ts_ev.predictions["top1"])
    assert list(namespace["pt2_ev"].predictions["top1"]) == list(live.predictions["top1"])
    for other in (onnx_ev, ts_ev, namespace["pt2_ev"]):  # max |probability delta| of the top-1 class
        np.testing.assert_allclose(other.predictions["top1_prob"], live.predictions["top1_prob"], atol=1e-5)
    assert np.isfinite(namespace["saved_ev"].latency["median_ms"]).all()
    three = namespace["three"]  # one PyTorch manifest in three frameworks: the converted copies agree
    assert three.frameworks == ["torch", "onnxruntime", "tensorflow"]
    assert (three.predictions.pivot(index="input_id", columns="framework", values="top1").nunique(axis=1) == 1).all()
    assert set(namespace["d"].first_divergent_layer.values()) == {None}


def test_agents_guide_names_only_real_flags_and_keywords():
    """docs/agents.md: every ``mlms VERB --flag`` in its shell blocks is a flag of that verb, every keyword of its
    Python calls is a parameter of the function, and its Python blocks compile (running them needs a cluster:
    tests/test_agents.py and example_notebooks/08_agents.ipynb do)."""
    import inspect

    import mlms_nb
    from mlms_nb.commands import cli_parser

    text = (DOCS / "agents.md").read_text(encoding="utf-8")
    verbs = cli_parser()._subparsers._group_actions[0].choices
    shell = "\n".join(re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M))
    tls = re.search(r'TLS="([^"]*)"', shell).group(1)
    calls = [line.replace("$TLS", tls).split("#")[0].split()[1:] for line in shell.splitlines()
             if line.startswith("mlms ")]
    assert len(calls) >= 10
    for words in calls:
        flags = {f for action in verbs[words[0]]._actions for f in action.option_strings}
        assert {w for w in words if w.startswith("--")} <= flags, words
    for block in _python_blocks(DOCS / "agents.md"):
        compile(block, "docs/agents.md", "exec")
    for name, keywords in re.findall(r"mlms_nb\.(\w+)\(([^)]*)\)", text):
        params = inspect.signature(getattr(mlms_nb, name)).parameters
        given = re.findall(r"(\w+)=", re.sub(r'"[^"]*"', '""', keywords))  # keywords outside quoted text
        assert set(given) <= set(params), (name, keywords)
