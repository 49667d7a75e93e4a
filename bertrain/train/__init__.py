"""Training: loop.py (Trainer, pretrain) drives setup.py, state.py (train state, RNG, resume rules,
checkpoint save/load), stream.py, step.py, evaluate.py, dry_run.py, optim.py, monitor.py and signals.py.

Kept import-light: `bertrain.train.signals` is imported before torch to catch early signals.
"""
