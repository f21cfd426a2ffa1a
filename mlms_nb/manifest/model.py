"""The manifest: the MLModelScope fields, validated with pydantic, errors that name the field path.

A manifest says what a model is (name, semantic version, where its graph and weights live, with their
sha256), which framework runs it (name and an npm-style version range such as ``^2.0`` or ``>=1.17``),
what its inputs look like and which declarative pre/post-processing steps turn an image into its input
tensor and its output into labels. One YAML file describes one model in one framework.

Reading is bounded (`mlms_nb.manifest.yaml_reader`: 1 MiB, UTF-8, nesting 50, 100,000 values after alias
expansion, no duplicate keys) and so are the values (`mlms_nb.manifest.checks`: image sides up to 4096
pixels, dimensions, finite normalize values, the softmax axis); a manifest whose preprocessing cannot give
``inputs[0]`` is refused at load. Every failure is a `ManifestError`: one sentence naming each bad field
path (or the line and column) and what to write instead. Discovery is `mlms_nb.manifest.catalog`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import semantic_version
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from mlms_nb.errors import ManifestError
from mlms_nb.manifest import checks
from mlms_nb.manifest.checks import field_errors
from mlms_nb.manifest.fields import (MAX_NAME, NAME_PATTERN, FrameworkSpec, InputSpec, ModelSpec, OutputSpec, Strict,
                                     bounded_text, problems_error)
from mlms_nb.manifest.steps import POSTPROCESS_OPS, PREPROCESS_OPS, Step
from mlms_nb.manifest.yaml_reader import read_manifest_yaml

# ---------------------------------------------------------------- the manifest

#: tasks whose accuracy is read from the first output's classes
CLASSIFYING_TASKS = ("image-classification", "text-classification")
#: element types of an input that carries token ids (a tensor input of these is text to `Manifest.effective_task`)
TOKEN_ID_TYPES = ("int32", "int64")

class Manifest(Strict):
    """One model in one framework (one YAML file)."""
    name: str = Field(pattern=NAME_PATTERN.pattern, max_length=MAX_NAME, examples=["my_cnn"],
                      description="lower-case letters, digits and . _ - ; with `framework.name` it identifies the model")
    version: str = Field("1.0.0", examples=["1.2.0"], description="semantic version of the model (quoted in YAML)")
    description: str = Field("", description="free text")
    license: str | None = Field(None, examples=["Apache-2.0"], description="the model's license")
    references: list[str] = Field(default_factory=list, examples=[["https://arxiv.org/abs/1512.03385"]],
                                  description="papers or pages about the model")
    framework: FrameworkSpec = Field(description="which framework runs it (see FrameworkSpec)")
    inputs: list[InputSpec] = Field(min_length=1, description="the model's inputs, each named when there are several; "
                                                              "the first that is not a constant or a state is the one "
                                                              "the dataset feeds (see InputSpec)")
    outputs: list[OutputSpec] = Field(min_length=1, description="the model's outputs, each named when there are "
                                                                "several; the first is the one classification reads "
                                                                "(see OutputSpec)")
    state: dict[str, str] = Field(default_factory=dict, examples=[{"new_state": "state"}],
                                  description="recurrent/streaming models: output name -> input name fed back into "
                                              "the next call (zeros of the input's dimensions first; reset per "
                                              "dataset item, carried over its ordered chunks)")
    preprocess: list[Step] = Field(default_factory=list, examples=[[{"resize": {"size": 256}},
                                                                    {"center_crop": {"size": 224}}]],
                                   description="steps from an image file to the input tensor (default: decode, "
                                               "resize, center_crop, normalize, to_layout from inputs[0])")
    postprocess: list[Step] = Field(default_factory=list, examples=[["softmax", {"top_k": {"k": 5}}]],
                                    description="steps from the output to class probabilities (softmax, top_k, code)")
    model: ModelSpec = Field(description="where the model comes from (see ModelSpec)")
    task: Literal["image-classification", "text-classification", "text-generation"] | None = Field(
        None, description="text-generation: a causal language model (a Hugging Face transformers model: a local "
                          "save_pretrained folder as model.graph_path, model.architecture or model.entrypoint), "
                          "measured by mlms-nb's generate loop (TTFT, TPOT, tokens/s; docs/language-models.md); "
                          "image-classification, text-classification: classes out of an image or of token ids, "
                          "one call per batch of inputs, as when absent (then the inputs and outputs say which: "
                          "`effective_task`)")
    tokenizer: str | None = Field(None, description="text-generation: the tokenizer (asset URI) that turns text prompts "
                                                    "into token ids: a tokenizer.json, or a GPT-2 style vocabulary "
                                                    "(vocab.json or encoder.json, with merges.txt or vocab.bpe beside "
                                                    "it); not needed with datasets of token ids")
    attributes: dict[str, Any] = Field(default_factory=dict, examples=[{"top1": 75.1}],
                                       description="free key/values kept with results (top1: published accuracy, %)")
    source: str | None = Field(default=None, exclude=True)  # the file it was read from

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) <= MAX_NAME and not NAME_PATTERN.match(value):
            raise ValueError(f"expected lower-case letters, digits and . _ - (starting with a letter or digit), "
                             f"such as my_model-v2, got {value!r}")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _semver(cls, value: Any) -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"{value!r} is a YAML number; write a quoted semantic version such as \"{_semver_hint(value)}\"")
        if not isinstance(value, str) or len(value) > 64:
            raise ValueError(f"expected a semantic version like 1.0.0, got {str(value)[:64]!r}")
        try:
            return str(semantic_version.Version(value))
        except ValueError:
            raise ValueError(f"expected a semantic version like 1.0.0, got {value!r}") from None

    @field_validator("description", "license", mode="before")
    @classmethod
    def _prose(cls, value: Any) -> Any:
        return bounded_text(value, 100_000, "text")

    @field_validator("preprocess")
    @classmethod
    def _pre_ops(cls, steps: list[Step]) -> list[Step]:
        return _only(steps, PREPROCESS_OPS, "preprocess")

    @field_validator("postprocess")
    @classmethod
    def _post_ops(cls, steps: list[Step]) -> list[Step]:
        return _only(steps, POSTPROCESS_OPS, "postprocess")

    @model_validator(mode="after")
    def _coherent(self) -> "Manifest":
        """Entries that repeat one another, and preprocessing that cannot give ``inputs[0]``."""
        problems = _duplicates("inputs", self.inputs) + _duplicates("outputs", self.outputs)
        problems += _named("inputs", self.inputs) + _named("outputs", self.outputs) + self._state_problems()
        fed = self.fed_index
        if fed is None:
            problems.append(("inputs", "every input is a constant or a state: one must take the dataset's data"))
        else:
            problems += checks.pipeline_problems(self.inputs[fed], list(self.preprocess), f"inputs[{fed}]")
            problems += self._unfed_problems(fed)
        if self.task in CLASSIFYING_TASKS and self.outputs[0].type != "classification":
            problems.append(("task", f"{self.task} reads classes from the first output, which is of type "
                                     f"{self.outputs[0].type}; make outputs[0] a classification output or drop task"))
        if self.model.reset and self.framework.name != "torch":
            problems.append(("model.reset", f"{self.framework.name} models have no method mlms-nb can call to clear "
                                            "their state (torch only): describe the state as explicit state: inputs "
                                            "and outputs"))
        if problems:
            raise problems_error(problems)
        return self

    def _state_problems(self) -> list[tuple[str, str]]:
        inputs = {spec.name: i for i, spec in enumerate(self.inputs) if spec.name}
        outputs = {spec.name for spec in self.outputs if spec.name}
        problems = []
        for out, into in self.state.items():
            if out not in outputs:
                problems.append((f"state.{out}", f"{out!r} is not the name of an output; name the output that gives "
                                                 "the new state in outputs[]"))
            if into not in inputs:
                problems.append((f"state.{out}", f"{into!r} is not the name of an input; name the state input in "
                                                 "inputs[]"))
                continue
            spec = self.inputs[inputs[into]]
            if spec.type == "constant" or spec.dynamic:
                problems.append((f"inputs[{inputs[into]}].dimensions", f"the state input {into!r} starts as zeros of "
                                                                       "its dimensions: give every size as a number"))
        return problems

    def _unfed_problems(self, fed: int) -> list[tuple[str, str]]:
        """Every input is fed by something: the dataset (the fed input), a constant, the state, or a tokenize step."""
        tokenized: dict[str, str] = {}
        for i, step in enumerate(self.preprocess):
            if step.op == "tokenize":
                for key in ("ids", "attention_mask", "type_ids"):
                    name = getattr(step.args, key)
                    if name:
                        tokenized[name] = f"preprocess[{i}].tokenize.{key}"
        names = {spec.name for spec in self.inputs}
        problems = [(path, f"{name!r} is not the name of an input; name one of inputs[]") for name, path in
                    tokenized.items() if name not in names and not (name == "input_ids" and len(self.inputs) == 1)]
        states = set(self.state.values())
        for i, spec in enumerate(self.inputs):
            if i == fed or spec.type == "constant" or spec.name in states or spec.name in tokenized:
                continue
            problems.append((f"inputs[{i}]", f"nothing feeds input {spec.name!r}: the dataset feeds "
                                             f"inputs[{fed}]; make it a constant (type: constant, value), a state "
                                             "(state: {output: input}) or an output of the tokenize step"))
        return problems

    @property
    def fed_index(self) -> int | None:
        """The index of the input the dataset feeds: the first that is neither a constant nor a state input."""
        states = set(self.state.values())
        return next((i for i, spec in enumerate(self.inputs)
                     if spec.type != "constant" and (spec.name is None or spec.name not in states)), None)

    @property
    def fed_input(self) -> InputSpec:
        """The input the dataset feeds (see `fed_index`)."""
        return self.inputs[self.fed_index or 0]

    @property
    def effective_task(self) -> str:
        """What the model does, for listings and for which options apply: the declared ``task``, else what the fed
        input and the first output say -- a classification output of an image is image-classification, of text or
        integer token ids text-classification, of audio audio-classification, of another tensor classification;
        tensor outputs (compared across frameworks, no accuracy) are ``tensor``."""
        if self.task:
            return self.task
        if self.outputs[0].type != "classification":
            return "tensor"
        fed = self.fed_input
        if fed.type == "image":
            return "image-classification"
        if fed.type == "text" or (fed.type == "tensor" and fed.element_type in TOKEN_ID_TYPES):
            return "text-classification"
        return "audio-classification" if fed.type == "audio" else "classification"

    # ------------------------------------------------------------------ conveniences
    @property
    def key(self) -> str:
        """``name@version/framework``: how history and the registry identify this manifest."""
        return f"{self.name}@{self.version}/{self.framework.name}"

    @property
    def has_code(self) -> bool:
        return any(s.op == "code" for s in [*self.preprocess, *self.postprocess])

    @property
    def pretrained(self) -> bool:
        return self.model.weights == "pretrained"

    def steps_table(self, which: Literal["preprocess", "postprocess"] = "preprocess"):
        """The ``preprocess`` (or ``postprocess``) steps as a table in the order they run, one row per argument:
        ``step`` (its number), ``op``, ``argument``, ``value`` (as text); a frame with a column per argument of
        every step would be mostly empty."""
        import pandas as pd

        rows = [{"step": number, "op": step.op, "argument": key, "value": str(value)}
                for number, step in enumerate(getattr(self, which), 1)
                for key, value in (step.args.model_dump(mode="json", exclude_none=True) or {"": ""}).items()]
        return pd.DataFrame(rows, columns=["step", "op", "argument", "value"])

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude_none=True)
        for spec, entry in zip(self.inputs, data["inputs"]):
            if spec.batch_axis is None and spec.type != "constant":
                entry["batch_axis"] = None  # no batch axis, said out loud (the default is 0)
        data["preprocess"] = [{s.op: s.args.model_dump(mode="json")} for s in self.preprocess]
        data["postprocess"] = [{s.op: s.args.model_dump(mode="json")} for s in self.postprocess]
        return data

    def save(self, path: str | os.PathLike) -> Path:
        """Write this manifest as YAML that `load_manifest` reads back to the same manifest; returns the path.
        Relative asset paths are read relative to the file's folder, so save it where they resolve."""
        import yaml

        from mlms_nb._fs import atomic_write_text

        if self.model.instance is not None:
            raise ManifestError(f"manifest {self.key} holds a live model object, which YAML cannot keep: describe "
                                "the model by model.entrypoint (and weights_path) or a graph_path file to save it")
        text = yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)
        parse_manifest(yaml.safe_load(text), source=str(path))  # what is written must read back
        return atomic_write_text(path, text)


def _semver_hint(value: int | float) -> str:
    parts = str(value).split(".") if isinstance(value, float) and value == value and abs(value) < 1e15 else ["1", "0"]
    parts = [p.lstrip("-") or "0" for p in parts][:3]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def _duplicates(field_name: str, entries: list[BaseModel]) -> list[tuple[str, str]]:
    """An entry named like an earlier one, or (unnamed) equal to one, is refused at its own index."""
    problems = []
    for i, entry in enumerate(entries):
        for j in range(i):
            other = entries[j]
            name = getattr(entry, "name", None)
            if name is not None and name == getattr(other, "name", None):
                problems.append((f"{field_name}[{i}].name", f"{name!r} is also the name of {field_name}[{j}]; "
                                                            "give each entry its own name"))
                break
            if entry == other:
                problems.append((f"{field_name}[{i}]", f"repeats {field_name}[{j}]; remove the copy"))
                break
    return problems


def _named(field_name: str, entries: list[BaseModel]) -> list[tuple[str, str]]:
    """With several entries each needs its name (the graph's, or the argument's), so that none is fed or read by
    guesswork."""
    if len(entries) < 2:
        return []
    what = "input" if field_name == "inputs" else "output"
    return [(f"{field_name}[{i}].name", f"a model with several {field_name} names each one (the ONNX graph {what} "
                                        f"name, the torch forward {'argument' if what == 'input' else 'result key or position'} "
                                        f"or the Keras {what})")
            for i, entry in enumerate(entries) if not getattr(entry, "name", None)]


def _only(steps: list[Step], allowed: tuple[str, ...], where: str) -> list[Step]:
    for i, step in enumerate(steps):
        if step.op not in allowed:
            raise ValueError(f"[{i}]: step {step.op!r} does not belong in {where}; expected one of {', '.join(allowed)}")
    return steps


# ---------------------------------------------------------------- parsing with field paths

def _describe(err: ValidationError) -> str:
    return "; ".join(f"{path or '<manifest>'}: {msg}" for path, msg in field_errors(err))


def parse_manifest(data: Any, source: str | None = None) -> Manifest:
    """Validate a manifest mapping; a `ManifestError` names every bad field path."""
    where = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}a manifest is a YAML mapping, got {type(data).__name__}")
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as err:
        raise ManifestError(f"{where}{_describe(err)}") from None
    except RecursionError:  # data built in Python, not read by load_manifest (whose nesting is bounded)
        raise ManifestError(f"{where}the manifest nests too deeply to validate") from None
    manifest.source = source
    return manifest


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate one manifest file, within the bounds of `mlms_nb.manifest.yaml_reader` (size 1 MiB, UTF-8,
    nesting 50, 100,000 values after alias expansion, no duplicate keys)."""
    return parse_manifest(read_manifest_yaml(path), source=str(path))
