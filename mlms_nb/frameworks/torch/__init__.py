"""PyTorch: the predictor, layer and op tracing, per-layer costs, per-layer output capture.

Nothing here is imported until a PyTorch model is opened (the registry in :mod:`mlms_nb.frameworks.base`
imports :mod:`.predictor` on demand), so ``import mlms_nb`` needs no PyTorch."""
