"""`bertrain tokenizer train`: a tokenizer from a data recipe's sources, read and cleaned as prepare does."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console

from bertrain.config import Recipe
from bertrain.data.prepare.documents import document_split, normalized_documents, raw_batches, resolve_inputs
from bertrain.data.prepare.pool import Workers
from bertrain.data.prepare.tokenizer_stage import in_sample
from bertrain.data.tokenizer import require_vocab_size, train_tokenizer

MAX_VALIDATION_CHARS = 10_000_000  # held-out text the unknown-token rate is measured on, at most


def train_tokenizer_from_recipe(recipe: Recipe, out_dir: str | Path, console: Any = None) -> dict[str, Any]:
    """`bertrain tokenizer train`: sources read as prepare does, validation held out by hash, seeded sample."""
    console = console or Console(stderr=True, quiet=True)
    config, tokenizer_config = recipe.prepare, recipe.tokenizer
    require_vocab_size(tokenizer_config)  # before reading the corpus, which may take hours
    counts: Counter = Counter()
    skipped: list = []
    inputs = resolve_inputs(config, counts, skipped)
    total = sum(item.size for _, items in inputs for item in items)
    keep = min(1.0, tokenizer_config.max_bytes / total) if total else 1.0
    validation: list[str] = []
    validation_chars = 0
    seen: set[int] = set()

    def texts() -> Iterator[str]:
        nonlocal validation_chars
        batches = raw_batches(inputs, config, counts, skipped, lambda amount: None)
        for sentences, digest in normalized_documents(batches, config, Workers(1), counts):
            split = document_split(sentences, digest, config, seen, counts)
            if split == "validation":
                if validation_chars < MAX_VALIDATION_CHARS:  # a running total: summing the list each time is quadratic
                    validation.extend(sentences)
                    validation_chars += sum(map(len, sentences))
            elif split == "train":
                text = "\n".join(sentences)
                if in_sample(text, keep, tokenizer_config.seed):
                    yield text

    with console.status(f"Training the {tokenizer_config.kind} tokenizer (vocab {tokenizer_config.vocab_size:,})..."):
        stats = train_tokenizer(texts(), tokenizer_config, out_dir, validation_texts=validation)
    stats["validation_sentences"] = len(validation)
    return stats
