"""The model zoo's code: the built-in architectures (PyTorch, and Keras copies of the same networks) and their
registry. Modules are imported on demand (``mlms_nb.zoo.registry``) so that importing this package needs neither
PyTorch nor TensorFlow. Building another framework's copy of a model lives in :mod:`mlms_nb.frameworks.convert`.
"""
