"""The model zoo's code: architectures (PyTorch and Keras), their registry, and conversions to ONNX / Keras.

Modules are imported on demand (``mlms_nb.models.registry``, ``mlms_nb.models.convert``) so that importing
this package needs neither PyTorch nor TensorFlow.
"""
