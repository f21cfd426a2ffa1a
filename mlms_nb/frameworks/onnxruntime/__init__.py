"""ONNX Runtime: the predictor, its session-profile import, ONNX graph costs, per-node output capture and the
INT8 (QDQ) copy. Imported on demand, like every framework folder."""
