"""Reading a saved tokenizer (tokenizer.json): one loader for data code (prepare, inspect) and model code
(fill-mask), which may not import each other."""

from __future__ import annotations

from pathlib import Path

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
