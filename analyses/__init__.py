"""Analyses: pure functions from trace / evaluation frames to tables (``compute``) and figures (``plot``).

- ``layers``: layer occurrence per type, latency per layer and per type, memory per layer
- ``batch_scaling``: latency and throughput against batch size, saturation point
- ``normalized``: latency per framework or system normalised to a baseline
- ``kernels``: GPU vs CPU time per layer, kernel table
- ``roofline``: per layer and per model across batch sizes, ridge point, memory- or compute-bound
- ``compare``: A/B comparison of two evaluations (significance test) and per-layer deltas
- ``timeline``: the spans of a trace on a zoomable timeline
- ``divergence``: where two frameworks' layer outputs diverge

Every ``plot`` takes ``backend="bokeh"`` or ``"matplotlib"``; :func:`show` displays a figure in a notebook
(Bokeh with INLINE resources), :func:`figure_page` gives the text of a standalone HTML page (``timeline.to_html``
writes the timeline's page to a file).
"""
from ._output import BOKEHJS_MARK, FIGURE_MARK, Displayable, show  # noqa: F401
from ._output import to_html as figure_page  # noqa: F401
