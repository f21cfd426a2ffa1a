"""TensorFlow: the predictor, its tf.profiler xplane import, per-layer output capture. Imported on demand, like
every framework folder."""
