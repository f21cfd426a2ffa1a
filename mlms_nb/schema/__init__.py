"""Column schemas, written down once: spans (:mod:`.spans`) and counters (:mod:`.counters`) with their shared building
blocks (:mod:`.columns`), trace levels (:mod:`.levels`), and the evaluation frames (:mod:`.evaluation`). Bottom layer:
imports nothing of mlms_nb but :mod:`mlms_nb.errors`."""
