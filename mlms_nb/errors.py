"""Errors a user sees. Each carries one sentence that names the problem and, where it helps, the fix."""
from __future__ import annotations


class MlmsError(Exception):
    """Base of every error mlms-nb raises on purpose; `str(err)` is meant to be shown as is."""


class ManifestError(MlmsError):
    """A manifest is malformed; the message names the field path (``inputs[0].dimensions: ...``)."""


class UnknownModelError(MlmsError, LookupError):
    """No manifest matches the requested model name (the message suggests the closest names)."""


class AssetError(MlmsError):
    """An asset could not be resolved, fetched or verified."""


class ChecksumMismatchError(AssetError):
    """An asset's sha256 differs from the one its manifest declares; nothing was cached."""


class FrameworkNotInstalledError(MlmsError, ImportError):
    """A framework (or another optional dependency) is missing; the message names the extra to install."""


class DatasetError(MlmsError):
    """A dataset could not be found, is empty, or does not fit the manifest."""


class InputDecodeError(DatasetError):
    """One input (an image, an audio file, a table cell) could not be read or decoded: datasets skip it and record
    why. Decoders raise a subclass of it (image decoding raises its own ImageDecodeError, skipped the same way)."""


class PredictorError(MlmsError):
    """A predictor could not open a model or run a batch."""


class TraceFormatError(MlmsError, ValueError):
    """A trace file is malformed, truncated or of an unknown structure; the message names the file and the fault.

    Raised before anything is returned: an import either gives a whole :class:`~mlms_nb.tracing.Trace` or this.
    """


class TraceSchemaError(MlmsError, ValueError):
    """A spans or counters frame does not follow :mod:`mlms_nb.schema.trace` (missing column, wrong dtype)."""


class AnalysisError(MlmsError, ValueError):
    """An analysis cannot run on what it was given (no layer spans, unknown plot backend, ...)."""


class RunFailedError(MlmsError):
    """Every framework failed after it started measuring (an error while running the model, e.g. during the first
    inference), with nothing measured: not bad input, so the CLI exits 1 (2 is "refused before measuring")."""


class UntrustedError(MlmsError):
    """An asset that can run code (a TorchScript or SavedModel file, an entrypoint, a code step) was not trusted;
    the message names it, says why it can run code and how to trust it (:mod:`mlms_nb.trust`)."""


class ModelFileError(PredictorError):
    """A model file is not what its framework can load (garbage, truncated, the wrong format or framework); the
    message names the file and the framework."""
