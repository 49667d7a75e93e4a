"""bertrain: pretrain BERT and ALBERT encoders from raw text."""

__version__ = "0.1.0"
