"""Chrome trace JSON (Perfetto / chrome://tracing): export and import.

Export (:func:`write_chrome`, :mod:`.export`): a JSON object ``{"otherData": {...}, "displayTimeUnit": "ns",
"traceEvents": [...]}``. Every span is an ``"X"`` (complete) event: ``cat`` = kind, ``ts``/``dur`` in µs as floats
with up to 3 decimals (ns precision; ``ts`` relative to ``otherData.mlms_nb.origin_ns``), ``pid`` = one per device
(``"M"`` process_name events name them), ``tid`` = the thread (the stream for device spans), ``args`` = the
span's other columns (defaults left out; id columns under their column names) with ``attrs`` inlined as an
object. Counters are ``"C"`` events (``cat`` = source, ``name`` = metric, ``args`` = ``{unit: value}``).
``otherData`` holds the trace's metadata plus ``otherData.mlms_nb`` (format, version, origin_ns, trace_id, pid ->
device), so our own export imports back without loss.

Import (:func:`read_chrome`, :mod:`.importer`), dialects detected from the file:

* our own export (``otherData.mlms_nb``): lossless;
* PyTorch Kineto (``torch.profiler`` ``export_chrome_trace``): :mod:`.kineto`;
* ONNX Runtime profiles (a top-level array with ``Session``/``Node`` events): :mod:`.ort`;
* any other Chrome trace: :mod:`.generic`.

Integer ids in args (``External id``, ``correlation``, ``Ev Idx``... see :data:`~mlms_nb.schema.spans.ID_COLUMNS`)
go to the id columns, the other args to ``attrs``. Parents of imported spans come from time containment on each
(pid, tid), and device activity without one from the runtime call that launched it
(:mod:`mlms_nb.tracing.attribution`). The column store that does the work, and why it is written for speed, is
:mod:`.columns`.
"""
from __future__ import annotations

from mlms_nb.tracing.chrome._common import FORMAT, FORMAT_VERSION
from mlms_nb.tracing.chrome.columns import CATEGORIES
from mlms_nb.tracing.chrome.export import write_chrome
from mlms_nb.tracing.chrome.importer import read_chrome

__all__ = ["CATEGORIES", "FORMAT", "FORMAT_VERSION", "read_chrome", "write_chrome"]
