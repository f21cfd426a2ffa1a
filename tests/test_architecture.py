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
