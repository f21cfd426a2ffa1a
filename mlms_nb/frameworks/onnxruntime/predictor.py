"""ONNX Runtime predictor: an ONNX graph on the CPU execution provider, or CUDA when present.

Tracing: at FRAMEWORK and deeper levels the session is re-created with ``SessionOptions.enable_profiling`` (ONNX
Runtime only profiles sessions created so), writing into a temporary folder (:mod:`mlms_nb.frameworks.profiling`);
``predict`` runs on it and records the ``perf_counter_ns`` window of each ``session.run``; ``stop_tracing`` ends
the profile, adds one ``layer`` span per node execution (see :mod:`mlms_nb.frameworks.onnxruntime.profile`),
deletes the folder and puts the untraced session back. Re-creating the session costs one model load (about
0.1-0.3 s for EfficientNet-Lite0) per ``start_tracing``.

Graph optimisation level (:mod:`.graph_map`): ``PredictorOptions.graph_optimization_level``, else the manifest's
``framework.options.graph_optimization_level``, else ONNX Runtime's default (``all``). The profiled session also
writes its optimised graph (``optimized_model_filepath``), which maps each timed node back to the original
graph's nodes: every layer span carries them (``attrs["original_nodes"]``), and the trace's
``metadata["onnxruntime.graph"]`` records the level, the node counts, and the inserted and unmapped nodes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import onnxruntime as ort

from mlms_nb._quiet import quiet
from mlms_nb.data.assets import resolve_asset
from mlms_nb.data.feeds import input_names, output_names
from mlms_nb.errors import ModelFileError, PredictorError
from mlms_nb.manifest import Manifest
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.frameworks.base import Predictor, PredictorInfo, PredictorOptions, device_kind, register_predictor
from mlms_nb.frameworks.modelfiles import refuse_other_framework, unreadable
from mlms_nb.frameworks.onnxruntime.graph_map import DEFAULT_LEVEL, GraphMap, check_level, ort_level
from mlms_nb.frameworks.profiling import FrameworkProfile


RUN_LOG_SEVERITY = 4
"""ONNX Runtime's own logger, for a call: fatal only. An error of a call comes back as its exception, which becomes our
sentence; without this ORT also prints it raw (``[E:onnxruntime:...] ... terminate flag`` on every cancel)."""


def _run_options() -> ort.RunOptions:
    options = ort.RunOptions()
    options.log_severity_level = RUN_LOG_SEVERITY
    return options


@register_predictor
class OnnxRuntimePredictor(Predictor):
    framework = "onnxruntime"
    extra = "onnx"
    cancellable = True  # RunOptions.terminate stops a run in progress

    def __init__(self) -> None:
        super().__init__()
        self.session: ort.InferenceSession | None = None
        self.artifact = ""
        self._providers: list = []
        self._plain_session: ort.InferenceSession | None = None  # the untraced session, while profiling
        self._profile: FrameworkProfile | None = None   # while profiling (state: the profiling start, Unix ns)
        self.graph_optimization_level = DEFAULT_LEVEL
        self._graph_map: GraphMap | None = None            # while profiling: optimised node -> original nodes
        self._run_options = _run_options()  # the calls' RunOptions: `cancel` terminates them, then swaps in new ones

    def open(self, manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> "OnnxRuntimePredictor":
        self.manifest, self.device, self.options = manifest, device, options or PredictorOptions()
        self._check(manifest)
        if not manifest.model.graph_path:
            raise PredictorError(f"manifest {manifest.key}: ONNX Runtime needs model.graph_path (an .onnx file)")
        base = Path(manifest.source).parent if manifest.source else None
        path = resolve_asset(manifest.model.graph_path, manifest.model.sha256.get("graph_path"), base)
        refuse_other_framework(path, "onnxruntime", manifest)
        if path.is_dir():
            raise ModelFileError(f"model.graph_path {path} is a folder; ONNX Runtime runs an .onnx file")
        self.artifact = str(path)
        providers = ["CPUExecutionProvider"]
        if device_kind(device) == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise PredictorError(
                    f"device {device!r} requested but this onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                    "(install onnxruntime-gpu)")
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        self._providers = providers
        self.graph_optimization_level = self._level(manifest, self.options)
        self.session = self._new_session(self.session_options())
        self._bind_names()
        return self

    def _bind_names(self) -> None:
        """Manifest input/output names -> graph names: by name, or the graph's first for one unnamed entry."""
        graph_in = [i.name for i in self.session.get_inputs()]
        graph_out = [o.name for o in self.session.get_outputs()]
        manifest = self.manifest
        names, outs = input_names(manifest), output_names(manifest)
        if len(manifest.inputs) == 1 and (manifest.inputs[0].name not in graph_in or len(graph_in) == 1):
            # one input: the graph's first, whatever the manifest calls it (names were informative before issue 11)
            self._graph_inputs = {names[0]: graph_in[0]}
        else:
            missing = [n for n in names if n not in graph_in]
            if missing:
                raise PredictorError(f"{manifest.key}: the ONNX graph has no input named {', '.join(map(repr, missing))}; "
                                     f"its inputs are {', '.join(graph_in)} (name inputs[] after them)")
            self._graph_inputs = {n: n for n in names}
        unfed = [g for g in graph_in if g not in self._graph_inputs.values()]
        if unfed:
            raise PredictorError(f"{manifest.key}: the ONNX graph also needs input(s) {', '.join(unfed)}, which "
                                 "inputs[] does not list; add each (a constant, a state or the fed input)")
        if len(manifest.outputs) == 1 and manifest.outputs[0].name not in graph_out:
            self._graph_outputs = {outs[0]: graph_out[0]}
        else:
            missing = [n for n in outs if n not in graph_out]
            if missing:
                raise PredictorError(f"{manifest.key}: the ONNX graph has no output named "
                                     f"{', '.join(map(repr, missing))}; its outputs are {', '.join(graph_out)}")
            self._graph_outputs = {n: n for n in outs}
        self._input = self._graph_inputs[names[0]]
        self._outputs = list(self._graph_outputs.values())

    def _new_session(self, so: ort.SessionOptions) -> ort.InferenceSession:
        try:
            with quiet(label=f"onnxruntime session of {Path(str(self.artifact)).name}"):  # "Serializing optimized model"
                return ort.InferenceSession(self.artifact, sess_options=so, providers=self._providers)
        except Exception as err:  # ORT raises its own exception types; say which file failed
            raise unreadable(self.artifact, "onnxruntime", "an ONNX graph", err) from None

    @staticmethod
    def _level(manifest: Manifest, options: PredictorOptions) -> str:
        """The graph optimisation level: the options', else the manifest's, else ONNX Runtime's default."""
        if "graph_optimization_level" in options.extra:
            return check_level(options.extra["graph_optimization_level"], "options.extra.graph_optimization_level")
        if options.graph_optimization_level:
            return check_level(options.graph_optimization_level)
        manifest_options = getattr(manifest.framework, "options", None)
        level = getattr(manifest_options, "graph_optimization_level", None)
        if level:
            return check_level(level, f"manifest {manifest.key}: framework.options.graph_optimization_level")
        return DEFAULT_LEVEL

    def session_options(self) -> ort.SessionOptions:
        """Session options from the predictor options (threads, graph optimisation level; ``extra`` keys set as
        attributes)."""
        so = ort.SessionOptions()
        so.graph_optimization_level = ort_level(self.graph_optimization_level)
        if self.options.threads:
            so.intra_op_num_threads = self.options.threads
        if self.options.inter_op_threads:
            so.inter_op_num_threads = self.options.inter_op_threads
        for key, value in self.options.extra.items():
            if key == "graph_optimization_level":
                continue  # set above, by name
            if not hasattr(so, key):
                raise PredictorError(f"unknown ONNX Runtime session option {key!r}")
            setattr(so, key, value)
        return so

    def predict(self, batch):
        if self.session is None:
            raise PredictorError("predict() before open(), or after close()")
        feeds = self.feeds
        if feeds.plain and isinstance(batch, np.ndarray):
            feed = {self._input: batch}
        elif feeds.plain and isinstance(batch, Mapping) and batch.keys() == {feeds.fed} and isinstance(
                batch[feeds.fed], np.ndarray):  # the full pass's call when it records every output: no checks to run
            feed = {self._input: batch[feeds.fed]}
        else:
            feed = {self._graph_inputs[k]: v for k, v in self.feeds(batch).items()}
        profile = self._profile
        if profile is None:
            results = self.session.run(self._outputs, feed, self._run_options)
        else:
            with profile.call(self._tracer.current_span_id() if self._tracer is not None else 0):
                results = self.session.run(self._outputs, feed, self._run_options)
        if not isinstance(batch, Mapping):
            return results[0]
        return dict(zip(self._graph_outputs, results))

    def cancel(self) -> None:
        """Terminate the run in progress (ONNX Runtime checks the flag between nodes and inside loops); the next
        call gets fresh RunOptions."""
        current, self._run_options = self._run_options, _run_options()
        current.terminate = True

    @property
    def native_model(self) -> ort.InferenceSession | None:
        """The untraced session (while tracing, ``predict`` runs on a profiling copy of it)."""
        return self._plain_session if self._profile is not None else self.session

    @property
    def artifact_path(self) -> str:
        return self.artifact if self.session is not None else ""

    def capture(self, module_names=(), rekey=None):
        """The graph file with every point's tensor as an output (see :class:`~.capture.OnnxCapture`), in a
        session of its own; an INT8 copy (``manifest.attributes["quantized_from"]``: the fp32 graph,
        :func:`~.quantize.quantized_manifest`) gives its dequantized tensors."""
        from mlms_nb.frameworks.onnxruntime.capture import OnnxCapture

        if self.session is None:
            raise PredictorError("capture() before open(), or after close()")
        return OnnxCapture(self.artifact, module_names, rekey, fp32_path=self.manifest.attributes.get("quantized_from"))

    # ------------------------------------------------------------------------------------------ tracing

    def tracing_levels(self) -> dict[str, str]:
        levels = super().tracing_levels()
        levels["FRAMEWORK"] = ("one span per ONNX node execution from ONNX Runtime's session profiler "
                               "(SessionOptions.enable_profiling; the session is re-created while tracing), "
                               "named after the PyTorch module the node came from (a fused node after the first "
                               "node it fused, its layer type listing the fused ops; a node ONNX Runtime inserted, "
                               "such as ReorderOutput, marked as inserted); nodes of the graph optimised at "
                               f"level {self.graph_optimization_level!r}, each mapped to the original nodes it "
                               "stands for")
        cuda = device_kind(self.device) == "cuda"
        levels["ML_LIBRARY"] = (
            "not supported: ONNX Runtime runs each node as one kernel of its execution provider and its profiler "
            "records nothing below nodes" + (" (on CUDA the kernels are SYSTEM_LIBRARY spans from CUPTI)" if cuda
                                             else " (the CPU provider's MLAS calls are not exposed)"))
        levels["SYSTEM_LIBRARY"] = (
            "not supported by ONNX Runtime's profiler here: CUDA kernels come from CUPTI at SYSTEM_LIBRARY "
            "(the runner's kernel recorder), attributed to these node spans" if cuda else
            "not supported on cpu: the CPU execution provider exposes no library calls below its nodes")
        return levels

    def _start_framework_tracing(self, tracer) -> None:
        if self.session is None or not tracer.enabled(TraceLevel.FRAMEWORK):
            return

        def profiled_session(folder: Path) -> tuple[ort.InferenceSession, int]:
            so = self.session_options()
            so.enable_profiling = True
            so.profile_file_prefix = str(folder / "ort")
            optimized = folder / "optimized.onnx"
            if self.graph_optimization_level != "disabled":
                so.optimized_model_filepath = str(optimized)
            session = self._new_session(so)
            self._graph_map = self._map_graph(optimized)
            return session, session.get_profiling_start_time_ns()

        self._profile = FrameworkProfile.start("mlms_ort_profile_", profiled_session)
        tracer.metadata["onnxruntime.graph"] = self._graph_map.summary()
        self._plain_session, self.session = self.session, self._profile.state[0]

    def _map_graph(self, optimized: Path) -> GraphMap:
        """Which nodes of the artifact each node of the session's (optimised) graph stands for."""
        from mlms_nb.frameworks.onnxruntime.graph_map import identity_map, map_optimized_graph

        try:
            if self.graph_optimization_level == "disabled" or not optimized.is_file():
                return identity_map(self.artifact, self.graph_optimization_level)
            return map_optimized_graph(self.artifact, optimized, self.graph_optimization_level)
        except Exception as err:  # noqa: BLE001 - a graph that cannot be mapped is still traced, and says why
            graph_map = GraphMap(self.graph_optimization_level)
            graph_map.unmapped = [f"the whole graph: {type(err).__name__}: {str(err)[:200]}"]
            return graph_map
        finally:
            optimized.unlink(missing_ok=True)

    def _stop_framework_tracing(self, tracer) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            return
        self.session, self._plain_session = self._plain_session, None

        def read(profile: FrameworkProfile) -> dict:
            from mlms_nb.frameworks.onnxruntime.profile import add_ort_profile

            (profiled, start_ns), profile.state = profile.state, None
            path = profiled.end_profiling()
            del profiled
            graph_map, self._graph_map = self._graph_map, None
            return add_ort_profile(tracer, path, start_ns, profile.wall_offset_ns,
                                   [w[:3] for w in profile.windows.values()],
                                   covers=graph_map.covers if graph_map and graph_map.covers else None,
                                   op_types=graph_map.op_types if graph_map else None)

        profile.finish(tracer, "onnxruntime.profiler", read)

    def close(self) -> None:
        super().close()  # stops tracing first (restores the untraced session)
        self.session = None

    def info(self) -> PredictorInfo:
        providers = self.session.get_providers() if self.session else []
        return PredictorInfo(
            framework="onnxruntime", framework_version=ort.__version__, device=self.device,
            threads=self.options.threads, artifact=self.artifact,
            details={"providers": providers, "graph_optimization_level": self.graph_optimization_level})
