"""Column schemas, written down once: spans and counters (:mod:`.trace`), trace levels (:mod:`.levels`), and the
evaluation frames (:mod:`.evaluation`). Bottom layer: imports nothing of mlms_nb but :mod:`mlms_nb.errors`."""
