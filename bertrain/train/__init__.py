"""Training: the Accelerate loop, optimizers, checkpoints, signals, monitoring.

Kept import-light: `bertrain.train.signals` is imported before torch to catch early signals.
"""
