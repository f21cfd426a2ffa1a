"""The trust model: which model files and manifest parts may run code, and who said they may.

Data formats load freely: ONNX graphs, safetensors, ``torch.load(weights_only=True)`` state dicts, images,
``.npz`` without pickles, Keras files whose layers are all built in (``safe_mode``). Formats that carry code
or operations of their own load only with trust: TorchScript programs, ``torch.export`` programs (``.pt2``),
TensorFlow SavedModels, Keras files with ``Lambda`` layers or custom objects, a manifest's
``model.entrypoint`` and its ``code`` steps.

Trust is given per run (``--trust``, ``trust=True``) or per asset in the trust store, ``MLMS_HOME/trust.json``,
which pins each trusted file or folder by its sha256: a changed file is no longer trusted. For entrypoints and
code steps the asset is the manifest file that names them. Built-in manifests (the package's own folder) and
the artifacts mlms-nb converted itself (under ``artifacts_dir()``, whose ``artifact.json`` records the same
sha256) are trusted by their checksums.

A refusal is an :class:`~mlms_nb.errors.UntrustedError`: one sentence naming the asset, why it can run code,
and the command that trusts it.

The check and the load use the same bytes: :func:`trusted_bytes` reads a file once, checks the sha256 of what it
read and returns those bytes for the framework to load from (``torch.jit.load(io.BytesIO(...))``);
:func:`trusted_copy` copies a folder (or a file a framework opens only by path) into a private folder of this
process, hashing what it copies, and the framework loads the copy. Whoever can write next to a trusted file can
replace it at any moment, and the replacement never runs in its place.
"""
from __future__ import annotations

import atexit
import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from mlms_nb._fs import atomic_write_text, folder_lock, sha256_file
from mlms_nb.errors import MlmsError, UntrustedError
from mlms_nb.paths import artifacts_dir, builtin_manifest_dir, mlms_home

__all__ = ["RISKS", "TrustEntry", "add", "asset_digest", "entries", "is_trusted", "remove", "require_trust",
           "store_path", "trust_command", "trusted_bytes", "trusted_copy"]

#: Why each kind of asset can run code (completes "... is a KIND, which ...").
RISKS = {
    "torchscript": ("a TorchScript program", "runs operations of its own when called (they can read and write "
                                             "files, e.g. torch.from_file)"),
    "torch.export": ("a torch.export program (.pt2)", "calls any registered operator, including ones that read and "
                                                       "write files"),
    "savedmodel": ("a TensorFlow SavedModel", "runs the TensorFlow ops of its own graph (they can read and write "
                                              "files, e.g. tf.io.write_file)"),
    "keras-code": ("a Keras model with Lambda layers or custom objects", "holds Python code that Keras runs only "
                                                                        "with safe_mode off"),
    "entrypoint": ("a manifest with a model.entrypoint", "imports a Python module and calls it"),
    "code": ("a manifest with code steps", "runs their Python source in this process"),
}


@dataclass(frozen=True)
class TrustEntry:
    """One trusted asset: its path when it was trusted, its sha256 then, what kind it is and when (UTC ISO)."""
    path: str
    sha256: str
    kind: str = ""
    added_at: str = ""


def store_path() -> Path:
    """The trust store: ``MLMS_HOME/trust.json``."""
    return mlms_home() / "trust.json"


def asset_digest(path: str | os.PathLike) -> str:
    """The sha256 that pins an asset: a file's own; a folder's over its files' relative paths and sha256s (sorted,
    links not followed)."""
    path = Path(path)
    if not path.is_dir():
        return sha256_file(path, memo=False)
    return _walk_digest(path, None)


def _walk_digest(path: Path, copy_to: Path | None) -> str:
    """A folder's digest (see :func:`asset_digest`); with ``copy_to``, each regular file is also written there as
    it is hashed, from the same bytes (links are neither hashed nor copied)."""
    digest = hashlib.sha256()
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        rel_folder = Path(folder).relative_to(path)
        if copy_to is not None:
            (copy_to / rel_folder).mkdir(parents=True, exist_ok=True)
        for name in sorted(names):
            file = Path(folder) / name
            if file.is_file() and not file.is_symlink():
                data_digest = _hash_file(file, None if copy_to is None else copy_to / rel_folder / name)
                digest.update(f"{file.relative_to(path).as_posix()}\0{data_digest}\n".encode())
    return digest.hexdigest()


def _hash_file(file: Path, copy_to: Path | None) -> str:
    """The sha256 of ``file`` as read now; with ``copy_to``, the same bytes are written there."""
    if copy_to is None:
        return sha256_file(file, memo=False)
    digest = hashlib.sha256()
    with open(file, "rb") as src, open(copy_to, "wb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            digest.update(chunk)
            dst.write(chunk)
    return digest.hexdigest()


def entries() -> list[TrustEntry]:
    """Every entry of the trust store (empty when there is none); a damaged store is an `MlmsError`."""
    path = store_path()
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [TrustEntry(**item) for item in data.get("trusted", [])]
    except (ValueError, TypeError, AttributeError) as err:
        raise MlmsError(f"the trust store {path} is damaged ({err}); fix or delete it, then trust your assets "
                        "again") from None


def _save(items: list[TrustEntry]) -> None:
    atomic_write_text(store_path(), json.dumps({"trusted": [asdict(e) for e in items]}, indent=2) + "\n")


def add(path: str | os.PathLike, kind: str = "") -> TrustEntry:
    """Trust the file or folder at ``path`` as it is now (its sha256 is pinned); replaces an entry of that path."""
    real = Path(path).expanduser()
    if not real.exists():
        raise MlmsError(f"cannot trust {path}: no such file or folder")
    real = real.resolve()
    entry = TrustEntry(str(real), asset_digest(real), kind,
                       _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    with folder_lock(mlms_home()):
        kept = [e for e in entries() if e.path != entry.path and e.sha256 != entry.sha256]
        _save([*kept, entry])
    return entry


def remove(path_or_digest: str | os.PathLike) -> list[TrustEntry]:
    """Stop trusting the entries of that path, or of that sha256 (a prefix of at least 8 hex digits will do)."""
    text = str(path_or_digest)
    real = str(Path(text).expanduser().resolve())
    def matches(e: TrustEntry) -> bool:
        return e.path == real or (len(text) >= 8 and e.sha256.startswith(text.lower()))
    with folder_lock(mlms_home()):
        items = entries()
        gone = [e for e in items if matches(e)]
        if not gone:
            raise MlmsError(f"{text} is not in the trust store {store_path()}; `mlms trust list` shows what is")
        _save([e for e in items if not matches(e)])
    return gone


def _inside(path: Path, root: Path) -> bool:
    try:
        return os.path.commonpath([str(path), str(root.resolve())]) == str(root.resolve())
    except ValueError:
        return False


def _self_converted(path: Path, digest: str) -> bool:
    """An artifact mlms-nb built: under ``artifacts_dir()``, beside an ``artifact.json`` recording this sha256."""
    if not _inside(path, artifacts_dir()):
        return False
    meta = path.parent / "artifact.json"
    try:
        return json.loads(meta.read_text(encoding="utf-8")).get("sha256") == digest
    except (OSError, ValueError, AttributeError):
        return False


def is_trusted(path: str | os.PathLike) -> bool:
    """Whether the asset at ``path`` is trusted without ``--trust``: built in, converted by mlms-nb, or in the
    trust store with its current sha256. (To load it, use :func:`trusted_bytes` or :func:`trusted_copy`, which
    check the very bytes that are loaded.)"""
    real = Path(path).expanduser().resolve()
    if _inside(real, builtin_manifest_dir()):
        return True
    if not real.exists():
        return False
    stored = entries()
    if not stored and not _inside(real, artifacts_dir()):
        return False  # nothing could match: no need to hash a large file
    return _digest_trusted(real, asset_digest(real), stored)


def _digest_trusted(real: Path, digest: str, stored: list[TrustEntry]) -> bool:
    return _self_converted(real, digest) or any(e.sha256 == digest for e in stored)


def _may_match(real: Path) -> list[TrustEntry] | None:
    """The trust store's entries, or None when no digest of ``real`` could be trusted (nothing to hash)."""
    stored = entries()
    if not stored and not _inside(real, artifacts_dir()):
        return None
    return stored


def trusted_bytes(path: str | os.PathLike, kind: str, trust: bool, what: str = "") -> bytes:
    """The bytes of the file at ``path``, read once; refused (`UntrustedError`, as :func:`require_trust`) unless
    ``trust`` is set or those very bytes are trusted. Load the model from what this returns, never from the path
    again: the file may have been replaced since."""
    real = Path(path).expanduser().resolve()
    with open(real, "rb") as handle:
        data = handle.read()
    if trust or _inside(real, builtin_manifest_dir()):
        return data
    stored = _may_match(real)
    if stored is not None and _digest_trusted(real, hashlib.sha256(data).hexdigest(), stored):
        return data
    _refuse(real, kind, what)


def trusted_copy(path: str | os.PathLike, kind: str, trust: bool, what: str = "") -> Path:
    """What to load for the file or folder at ``path``: a private copy (in a folder only this process writes,
    removed when the process ends) whose sha256 was computed from the bytes that were copied, when that sha256 is
    trusted; ``path`` itself when ``trust`` is set (the run trusts whatever is there) or it is built in. Refused
    (`UntrustedError`) otherwise. Symbolic links inside a folder are not copied (they are not part of its sha256
    either)."""
    real = Path(path).expanduser().resolve()
    if trust or _inside(real, builtin_manifest_dir()):
        return real
    stored = _may_match(real)
    if stored is None:
        _refuse(real, kind, what)
    private = Path(tempfile.mkdtemp(prefix="mlms-trusted-"))
    atexit.register(shutil.rmtree, private, True)
    copy = private / real.name
    try:
        if real.is_dir():
            copy.mkdir()
            digest = _walk_digest(real, copy)
        else:
            digest = _hash_file(real, copy)
    except OSError:
        shutil.rmtree(private, ignore_errors=True)
        raise
    if _digest_trusted(real, digest, stored):
        return copy
    shutil.rmtree(private, ignore_errors=True)
    _refuse(real, kind, what)


def trust_command(path: str | os.PathLike) -> str:
    """The command that trusts the asset at ``path``."""
    return f"mlms trust add {_quote(str(Path(path).expanduser().resolve()))}"


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def require_trust(path: str | os.PathLike | None, kind: str, trust: bool, what: str = "") -> None:
    """Refuse (`UntrustedError`) unless ``trust`` (this run's) is set or the asset at ``path`` is trusted.

    ``kind`` is a key of :data:`RISKS`; ``what`` names the asset when it is not a file (a manifest built in Python,
    ``path`` None), which only per-run trust can allow."""
    if trust or (path is not None and is_trusted(path)):
        return
    noun, risk = RISKS[kind]
    if path is None:
        raise UntrustedError(f"{what} is {noun}, which {risk}; it was not run: pass trust=True (--trust) to run it "
                             "(save the manifest to a file to trust it once with `mlms trust add FILE`)")
    _refuse(path, kind, what)


def _refuse(path: str | os.PathLike, kind: str, what: str = ""):
    noun, risk = RISKS[kind]
    real = Path(path).expanduser().resolve()
    changed = [e for e in entries() if e.path == str(real)]
    again = " (it changed since it was trusted)" if changed else ""
    name = f"{what} ({real})" if what else str(real)
    raise UntrustedError(f"{name} is {noun}, which {risk}; it was not run{again}: trust it with "
                         f"`{trust_command(real)}` (Python: mlms_nb.trust_add(...)) or pass --trust (trust=True) "
                         "for this run")
