"""Training: loop.py drives the rest. Import-light: `bertrain.train.signals` is imported before torch."""
