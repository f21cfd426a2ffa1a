"""Named inputs and outputs in TensorFlow (issue 11): a Keras functional model of two named inputs and two outputs,
evaluated as a live object described by a list of inputs; each output captured by name."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import mlms_nb  # noqa: E402


def test_keras_inputs_and_outputs_by_name(mlms_home):
    import keras

    signal = keras.Input((6,), name="signal")
    gain = keras.Input((1,), name="gain")
    scaled = keras.layers.Multiply(name="scaled")([signal, gain])
    total = keras.layers.Dense(1, name="total", kernel_initializer="ones", use_bias=False)(scaled)
    model = keras.Model({"signal": signal, "gain": gain}, {"scaled": scaled, "total": total})
    ev = mlms_nb.evaluate(model, inputs=[{"name": "signal", "type": "tensor", "dimensions": [6]},
                                         {"name": "gain", "type": "constant", "value": [2.0], "batch_axis": 0}],
                          outputs=[{"name": "total", "type": "tensor"}, {"name": "scaled", "type": "tensor"}],
                          dataset="synthetic:3", batch_sizes=[2], capture_outputs="all", warmup=1, min_repeats=2,
                          min_time_s=0, progress=False, history=False)
    assert ev.complete, ev.missing()
    rows = ev.outputs.set_index(["input_id", "output"])
    scaled = np.asarray(rows.loc[("synthetic-00000", "scaled"), "values"])
    total = np.asarray(rows.loc[("synthetic-00000", "total"), "values"])
    assert scaled.shape == (6,) and total == pytest.approx(scaled.sum(), rel=1e-5)
    x = np.random.default_rng([0, 0]).standard_normal(6, dtype=np.float32)  # SyntheticDataset's input 0
    np.testing.assert_allclose(scaled, 2.0 * x, rtol=1e-6)
    assert "Outputs: tensorflow: 3 inputs x 2 output(s), values of 3 inputs kept" in ev.to_text()
