"""The structure holds: the import-linter layers, the facade's names, where the analyses are installed."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import mlms_nb

REPO = Path(__file__).resolve().parents[1]


def test_import_layers_are_kept():
    from importlinter import api as linter

    report_lines = []
    result = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    report_lines.append(result.stdout[-3000:])
    assert result.returncode == 0, "\n".join(report_lines)
    contracts = linter.read_configuration(str(REPO / "pyproject.toml"))["contracts_options"]
    assert {c["type"] for c in contracts} >= {"layers", "forbidden", "independence"}


def test_no_public_name_is_also_a_subpackage():
    """``mlms_nb.models`` was once a function and a subpackage: importing the subpackage replaced the function."""
    submodules = {m.name for m in pkgutil.iter_modules(mlms_nb.__path__)}
    assert not submodules & set(mlms_nb.__all__), submodules & set(mlms_nb.__all__)


def test_models_still_callable_after_an_evaluation(real_evaluation):
    """An evaluation imports the predictor, evaluation and data subpackages; none of them may shadow a public
    function of the root (``mlms_nb.models`` was once replaced by a subpackage this way). In-process: the session's
    real evaluation has already imported all of them."""
    import mlms_nb

    assert real_evaluation.complete
    assert callable(mlms_nb.models) and callable(mlms_nb.evaluate) and callable(mlms_nb.history)
    frame = mlms_nb.models()
    assert {"model", "framework", "version"} <= set(frame.columns) and "resnet50" in set(frame["model"])


def test_analyses_ship_only_inside_mlms_nb(tmp_path):
    outside = subprocess.run([sys.executable, "-c", "import analyses"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, env=_env())
    assert outside.returncode != 0 and "No module named 'analyses'" in outside.stderr
    inside = subprocess.run([sys.executable, "-c", "import mlms_nb.analyses.layers, mlms_nb.analyses.roofline"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env())
    assert inside.returncode == 0, inside.stderr[-2000:]


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_importing_the_package_loads_no_framework_and_no_store(tmp_path):
    """``import mlms_nb`` is lazy (PEP 562): workers, reader processes and ``mlms --help`` pay only for what they
    use; the first use of a facade name imports the facade."""
    code = ("import sys, mlms_nb\n"
            "heavy = {'sqlalchemy', 'torch', 'onnxruntime', 'tensorflow', 'pandas', 'mlms_nb.api'}\n"
            "print(sorted(m for m in sys.modules if m in heavy or m.split('.')[0] in heavy))\n"
            "mlms_nb.evaluate\n"
            "print('mlms_nb.api' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env=_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["[]", "True"], result.stdout


def test_data_objects_declare_their_analysis_methods():
    """``ev.layers()`` is ``mlms_nb.layers(ev)``, declared in the class body (no method lent at run time)."""
    from mlms_nb._facade import FacadeMethod
    from mlms_nb.evaluation.result import Evaluation
    from mlms_nb.tracing.trace import Trace

    for cls, names in ((Evaluation, ("layers", "roofline", "batch_scaling", "compare", "timeline", "kernels")),
                       (Trace, ("layers", "timeline", "kernels"))):
        for name in names:
            assert isinstance(cls.__dict__[name], FacadeMethod) and f"mlms_nb.{name}(" in cls.__dict__[name].__doc__
            assert callable(getattr(mlms_nb, name))


# ---------------------------------------------------------------- no private name read across modules

def _modules() -> dict[str, Path]:
    """Every module of mlms_nb (the analyses folder is a link inside it) by dotted name."""
    import os

    root = REPO / "mlms_nb"
    found = {}
    for folder, _, names in os.walk(root, followlinks=True):
        for file in names:
            if file.endswith(".py"):
                parts = (Path(folder) / file).relative_to(REPO).with_suffix("").parts
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = Path(folder) / file
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def private_reads(source: str, module: str, modules: set[str]) -> list[str]:
    """Where ``module`` (its ``source``) reads a private name of another of our modules: ``from X import _name``,
    ``X._name`` on an imported module, or a private module (``pkg._mod``) imported from outside ``pkg``. A private
    module is private to its package: its siblings may import it."""
    import ast

    found, aliases = [], {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlms_nb":
            paths = [node.module]
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:  # a submodule: private to its package
                    paths.append(full)
                    aliases[alias.asname or alias.name] = full
                elif _private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            paths = [a.name for a in node.names if a.name.split(".")[0] == "mlms_nb"]
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in modules})
        else:
            continue
        for path in paths:
            parts = path.split(".")
            for i, part in enumerate(parts):
                if _private(part) and not _inside(module, ".".join(parts[:i])):
                    found.append(f"line {node.lineno}: private module {'.'.join(parts[:i + 1])} imported")
                    break
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and aliases.get(node.value.id, module) != module):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    return found


def test_no_private_name_is_read_across_modules():
    modules = _modules()
    found = [f"{path.relative_to(REPO)} {where}" for name, path in sorted(modules.items())
             for where in private_reads(path.read_text(encoding="utf-8"), name, set(modules))]
    assert not found, "private names read across modules (make them public where they live):\n" + "\n".join(found)


def test_the_private_name_scan_sees_each_form():
    modules = {"mlms_nb.a", "mlms_nb.a.m", "mlms_nb.a._p", "mlms_nb.b", "mlms_nb.b.n", "mlms_nb._fs"}
    assert private_reads("from mlms_nb.a.m import _x\nfrom mlms_nb.a.m import y\n", "mlms_nb.b.n", modules) == [
        "line 1: from mlms_nb.a.m import _x"]
    assert private_reads("from mlms_nb.a import m\nm._x\nm.y\n", "mlms_nb.b.n", modules) == [
        "line 2: m._x (mlms_nb.a.m)"]
    assert private_reads("import mlms_nb.a.m as m\nm._x\n", "mlms_nb.b.n", modules) == ["line 2: m._x (mlms_nb.a.m)"]
    assert private_reads("from mlms_nb.a._p import x\n", "mlms_nb.b.n", modules) == [
        "line 1: private module mlms_nb.a._p imported"]
    assert private_reads("from mlms_nb.a import _p\n", "mlms_nb.b.n", modules) == [
        "line 1: private module mlms_nb.a._p imported"]
    # a private module's siblings, the bottom layer's private modules, and a module's own names are fine
    assert private_reads("from mlms_nb.a import _p\nfrom mlms_nb.a._p import x\n_p._y\n", "mlms_nb.a.m", modules) == [
        "line 3: _p._y (mlms_nb.a._p)"]
    assert private_reads("from mlms_nb._fs import atomic_write\n_own = 1\n", "mlms_nb.b.n", modules) == []
