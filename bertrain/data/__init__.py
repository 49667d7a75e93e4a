"""Data side: corpora, tokenizers, prepared shards, pairs, masking, loaders. Never imports bertrain.model."""
