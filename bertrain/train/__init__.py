"""Training: loop.py (Trainer, pretrain) drives setup.py, checkpoint.py (train state, RNG, checkpoint save/load,
resume choice, RUN_DIR lock), stream.py, step.py, evaluate.py, dry_run.py, optim.py, monitor.py and signals.py.

Kept import-light: `bertrain.train.signals` is imported before torch to catch early signals.
"""
