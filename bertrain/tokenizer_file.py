"""Reading a saved tokenizer (tokenizer.json): one loader for data code (prepare, inspect) and model code
(fill-mask), which may not import each other."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tokenizers import Tokenizer

from bertrain.errors import DataError


# The files of a saved tokenizer: tokenizer.json and the wrappers transformers' AutoTokenizer reads.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "added_tokens.json")


def tokenizer_file(path: str | Path) -> Path:
    """tokenizer.json inside a directory, or the file itself."""
    path = Path(path)
    return path / "tokenizer.json" if path.is_dir() else path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizers.Tokenizer from a directory holding tokenizer.json or from the file."""
    file = tokenizer_file(path)
    if not file.is_file():
        raise DataError(f"No tokenizer at '{path}': expected a tokenizer.json file or a directory holding one.")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises plain Exceptions for a malformed file
        raise DataError(f"'{file}' is not a valid tokenizers JSON file ({error}).") from None


def _normalizers(normalizer: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The steps of a tokenizer.json normalizer: a Sequence's, or the one."""
    if not normalizer:
        return []
    if normalizer.get("type") == "Sequence":
        return [step for inner in normalizer.get("normalizers", []) for step in _normalizers(inner)]
    return [normalizer]


def normalizer_settings(tokenizer: Tokenizer) -> dict[str, bool]:
    """tokenizer_config.json's case and accent keys as tokenizer.json's normalizer does them. AutoTokenizer reads the
    normalizer itself; transformers' BertTokenizer and AlbertTokenizer classes rebuild theirs from these keys, and
    without them strip accents (BERT whenever it lowercases, ALBERT always)."""
    data = json.loads(tokenizer.to_str())
    steps = _normalizers(data.get("normalizer"))
    lowercase = any(step.get("type") == "Lowercase" or step.get("lowercase") for step in steps)
    strip = any(step.get("type") == "StripAccents" or step.get("strip_accents") or (  # BERT's null follows lowercase
        step.get("type") == "BertNormalizer" and step.get("strip_accents") is None and step.get("lowercase"))
                for step in steps)
    if data.get("model", {}).get("type") == "Unigram":
        return {"do_lower_case": lowercase, "keep_accents": not strip}
    return {"do_lower_case": lowercase, "strip_accents": strip}


def corpus_tokenizer(path: str | Path) -> Tokenizer:
    """load_tokenizer for corpus text: a literal `[MASK]` or `<pad>` in it is text, split like any other word (as
    Google's create_pretraining_data read it), not the special token's id that masking and the loss treat as text."""
    tokenizer = load_tokenizer(path)
    tokenizer.encode_special_tokens = True
    return tokenizer


@contextmanager
def special_tokens_as_text(tokenizer: Tokenizer) -> Iterator[Tokenizer]:
    """Within the block `tokenizer` encodes corpus text as corpus_tokenizer's does (a literal `[MASK]` is text)."""
    before, tokenizer.encode_special_tokens = tokenizer.encode_special_tokens, True
    try:
        yield tokenizer
    finally:
        tokenizer.encode_special_tokens = before


def token_strings(path: str | Path, vocab_size: int) -> list[str]:
    """Each id's token string, `<id>` where the tokenizer cannot be read (for figures that stay useful without)."""
    try:
        vocab = load_tokenizer(path).get_vocab(with_added_tokens=True)
    except DataError:
        vocab = {}
    tokens = [f"<{i}>" for i in range(vocab_size)]
    for token, token_id in vocab.items():
        if token_id < vocab_size:
            tokens[token_id] = token
    return tokens
