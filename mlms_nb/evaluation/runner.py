"""The evaluation runner: one evaluation over one or more frameworks, each framework's work run through a launcher.

Per framework, :func:`~mlms_nb.evaluation.work.measure_framework` (open, cold start, the full pass, timed loops
per batch size, the traced pass) runs where the launcher puts it: in this process (``inline``) or in a worker process
(``process``, ``isolate=True``). Its records stream back as they are made; the runner assembles the `Evaluation`
from them (:class:`~mlms_nb.evaluation.assemble.Assembler`) and hands it to ``sink(evaluation, framework)`` after
every measurement, so the caller can store it at once (the facade appends it to the history store).

Every framework asked for leaves a row in the history, a `failed` one with its reason when nothing was measured
(an error, a stop before its first measurement, not run at all). Nothing measured is lost: an error, a timeout or a crash in one framework is that framework's outcome (the others
go on); Ctrl-C, SIGTERM or SIGHUP stop the evaluation in order, keeping every record that arrived, the cut-short
loop included, and the frameworks not run are listed with why. When nothing at all was measured because every
framework failed with an error, that error is raised as it came (bad input gets its own sentence).
"""
from __future__ import annotations

import logging
from typing import Callable

from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.assemble import Assembler
from mlms_nb.evaluation.checks import check_before_loading
from mlms_nb.evaluation.progress import ProgressDisplay
from mlms_nb.evaluation.records import PassProgress
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.targets import shippable
from mlms_nb.evaluation.work import FrameworkJob, measure_framework
from mlms_nb.launchers import Launcher, Limits, Outcome, StopRequested, Work, get_launcher, outcome_of
from mlms_nb.launchers.stopping import deferred, stop_signals
from mlms_nb.manifest import Manifest, canonical_framework, find_manifest
from mlms_nb.options import EvaluateOptions, spell

log = logging.getLogger(__name__)

Sink = Callable[[Evaluation, str], None]


def resolve_manifests(model: str | Manifest, frameworks: list[str], explicit: bool = True) -> list[Manifest]:
    """One manifest per requested framework. A `Manifest` or a manifest path names one framework: asking for
    another (``explicit``: the frameworks were given, not the default) is refused with a sentence."""
    text = "" if isinstance(model, Manifest) else str(model)
    if isinstance(model, Manifest) or text.endswith((".yaml", ".yml")) or "/" in text:
        manifest = find_manifest(model)
        others = [fw for fw in frameworks if fw != manifest.framework.name]
        if explicit and others:
            where = manifest.source or manifest.key
            raise MlmsError(f"{where} is a manifest for {manifest.framework.name}, so {spell('framework', ','.join(frameworks))} "
                            f"cannot run it in {', '.join(others)}: give the model's name ({manifest.name}) to run it "
                            "in several frameworks, or that framework's manifest")
        return [manifest]
    return [find_manifest(model, framework=canonical_framework(fw)) for fw in dict.fromkeys(frameworks)]


def default_dataset(manifest: Manifest) -> str:
    """Labeled photos for pretrained image classifiers; synthetic tensors otherwise."""
    image_classifier = manifest.fed_input.type == "image" and manifest.outputs[0].type == "classification"
    return "imagenet-samples" if manifest.pretrained and image_classifier else "synthetic"


class EvaluationRunner:
    """Runs one evaluation over several manifests (frameworks) with one set of options."""

    def __init__(self, manifests: list[Manifest], options: EvaluateOptions, sink: Sink | None = None,
                 launcher: Launcher | None = None, metrics=None):
        self.manifests = manifests
        self.metrics = metrics  # output metrics (names or {name: fn}): agreement here; targets in the work
        self.options = options
        self.sink = sink
        names = {m.name for m in manifests}
        if len(names) != 1:
            raise MlmsError(f"one evaluation covers one model; got {sorted(names)}")
        iso = options.isolation
        self.launcher = launcher or get_launcher(iso.launcher, Limits(iso.call_timeout_s, iso.run_timeout_s,
                                                                      iso.memory_limit_bytes))

    def run(self) -> Evaluation:
        first = self.manifests[0]
        if self.options.dataset is None:
            self.options = self.options.model_copy(update={"dataset": default_dataset(first)})
        opts = self.options
        check_before_loading(self.manifests, opts, self.launcher.name)
        _sweep_orphans()
        frameworks = [m.framework.name for m in self.manifests]
        evaluation = Evaluation(
            model=first.name, model_version=first.version, frameworks=frameworks,
            manifests={m.framework.name: m.to_dict() for m in self.manifests},
            stack=self.launcher.stack(frameworks), options={**opts.record(), "isolation": self.launcher.describe(),
                                                            **_manifest_file(first)})
        assembler = Assembler(evaluation, opts.batch_sizes, opts.scenario, metrics=self.metrics)
        progress = ProgressDisplay(first.name, opts.progress)
        stop: BaseException | None = None
        outcomes: dict[str, Outcome] = {}
        try:
            with stop_signals():
                for manifest in self.manifests:
                    stop = self._one(manifest, evaluation, assembler, progress, stop, outcomes)
        finally:
            progress.close()
        if not assembler.measured and stop is None and outcomes and all(o.status == "error" for o in outcomes.values()):
            first_failure = next(iter(outcomes.values()))
            for o in outcomes.values():
                log.debug("%s", o.detail)
            error = first_failure.error
            if isinstance(error, MlmsError) and str(error) == first_failure.message:
                raise error  # bad input: its own sentence, its own type
            raise MlmsError(first_failure.message)
        for fw, outcome in evaluation.outcomes.items():  # frameworks not run at all
            if outcome.get("status") == "not run":
                _warn_missing(evaluation, fw)
        return evaluation

    def _one(self, manifest: Manifest, evaluation: Evaluation, assembler: Assembler, progress,
             stop: BaseException | None, outcomes: dict[str, Outcome]) -> BaseException | None:
        """One framework: launched, finished and handed to the sink; returns the stop that ended the evaluation."""
        fw = manifest.framework.name
        try:
            if stop is not None:
                with deferred():
                    why = outcome_of(stop, fw)
                    assembler.not_run(fw, why.status, f"not run: the evaluation was {why.message} before it")
                    self._store(evaluation, fw)  # a failed row with its reason: the history shows it was asked for
                return stop
            with deferred():
                assembler.started(fw)

            def on_record(record) -> None:
                with deferred():
                    progress.on_record(record)
                    if not isinstance(record, PassProgress) and assembler.add(record):
                        self._store(evaluation, fw)

            metrics, unshipped = (self.metrics, []) if self.launcher.name == "inline" else shippable(self.metrics)
            job = FrameworkJob(manifest, self.options, f"{evaluation.id}-{fw}", metrics, tuple(unshipped))
            try:
                outcome = self.launcher.launch(Work(measure_framework, (job,), fw), on_record)
            except (KeyboardInterrupt, StopRequested) as err:
                stop, outcome = err, outcome_of(err, fw)
            outcomes[fw] = outcome
            with deferred():
                progress.finish(fw)
                self._finish(fw, outcome, evaluation, assembler)
        except (KeyboardInterrupt, StopRequested) as err:  # arrived between two steps, each of them whole
            if stop is not None and stop is not err:
                raise  # a third Ctrl-C: the user abandons the clean-up
            stop = err
            if evaluation.outcomes.get(fw, {}).get("status") == "running":
                self._finish(fw, outcome_of(err, fw), evaluation, assembler)
        return stop

    def _finish(self, fw: str, outcome: Outcome, evaluation: Evaluation, assembler: Assembler) -> None:
        result = assembler.finish(fw, outcome)
        _warn_missing(evaluation, fw)
        if not outcome.ok:
            log.debug("%s ended: %s\n%s", fw, outcome.message, outcome.detail)
        self._store(evaluation, fw)  # with nothing measured, a failed row with its reason
        if result["status"] != "complete" and outcome.message:
            log.warning("%s", outcome.message if outcome.message.startswith(fw) else f"{fw}: {outcome.message}")

    def _store(self, evaluation: Evaluation, fw: str) -> None:
        if self.sink is not None:
            self.sink(evaluation, fw)


def _manifest_file(manifest: Manifest) -> dict:
    """``{"manifest": absolute path}`` for a manifest read from the user's file (the reproduce command names it);
    empty for a built-in one (its name finds it) or one built in memory."""
    from pathlib import Path

    from mlms_nb.paths import builtin_manifest_dir

    if not manifest.source:
        return {}
    path = Path(manifest.source).resolve()
    return {} if path.is_relative_to(builtin_manifest_dir().resolve()) else {"manifest": str(path)}


def _warn_missing(evaluation: Evaluation, fw: str) -> None:
    """The sentence saying what ``fw`` did not measure and why, among the result's warnings (shown, stored)."""
    for sentence in evaluation.missing():
        if sentence.startswith(f"{fw}:") and sentence not in evaluation.warnings:
            evaluation.warnings.append(sentence)


def _sweep_orphans() -> None:
    """Remove what earlier runs killed outright (SIGKILL, the OOM killer) left behind: temporary files in
    MLMS_HOME (artifacts, assets, fallback files) and profiling folders in the temp dir."""
    import tempfile

    from mlms_nb._fs import sweep_orphans
    from mlms_nb.paths import mlms_home

    removed = sweep_orphans(tempfile.gettempdir()) + sweep_orphans(mlms_home(), depth=3)
    if removed:
        log.info("removed %d temporary file(s) left by runs that were killed", len(removed))

