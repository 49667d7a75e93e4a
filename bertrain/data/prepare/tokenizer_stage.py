"""Stage 2, tokenizer: train on a seeded sample of the train documents, or copy an existing one
(-> DATA_DIR/tokenizer/)."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

from bertrain.config import TokenizerConfig
from bertrain.console import human_seconds
from bertrain.data.prepare.workdir import WORK
from bertrain.data.tokenizer import save_tokenizer, tokenizer_kind, train_tokenizer
from bertrain.files import file_sha256
from bertrain.tokenizer_file import load_tokenizer


def iter_document_texts(path: Path) -> Iterator[str]:
    """Documents of a stage-1 file, each as its sentences joined by newlines."""
    lines: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line == "\n":
                if lines:
                    yield "".join(lines)
                    lines = []
            else:
                lines.append(line)
    if lines:
        yield "".join(lines)


def in_sample(text: str, keep: float, seed: int) -> bool:
    """Whether a document belongs to the seeded tokenizer-training sample (kept with probability keep)."""
    if keep >= 1.0:
        return True
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=seed.to_bytes(8, "big", signed=True))
    return int.from_bytes(digest.digest(), "big") < keep * 2.0 ** 64


def sample_documents(paths: list[Path], total_chars: int, config: TokenizerConfig) -> Iterator[str]:
    """A seeded sample of documents of at most config.max_bytes (each kept with one probability)."""
    keep = min(1.0, config.max_bytes / max(total_chars, 1))
    used = 0
    for path in paths:
        for text in iter_document_texts(path):
            if not in_sample(text, keep, config.seed):
                continue
            used += len(text)
            if used > config.max_bytes:
                return
            yield text


def copy_tokenizer(tokenizer_path: str, target: Path, console: Any) -> dict[str, Any]:
    """Save an existing tokenizer (directory or tokenizer.json) into DATA_DIR; return its stats."""
    loaded = load_tokenizer(tokenizer_path)
    kind = tokenizer_kind(loaded)
    save_tokenizer(loaded, target, kind)
    console.print(f"Using the existing {kind} tokenizer {tokenizer_path} ({loaded.get_vocab_size():,} tokens).")
    return {"kind": kind, "vocab_size": loaded.get_vocab_size(), "source": str(tokenizer_path),
            "sha256": file_sha256(target / "tokenizer.json")}


def build_tokenizer(out: Path, documents: dict[str, Any], config: TokenizerConfig, console: Any) -> dict[str, Any]:
    """Stage 2: train a tokenizer on the train documents, or copy the existing one at `config.path`."""
    target = out / "tokenizer"
    if target.exists():
        shutil.rmtree(target)
    if config.path:
        return copy_tokenizer(config.path, target, console)
    paths = [out / WORK / "documents" / "train" / f"{s['name']}.txt" for s in documents["shards"]["train"]]
    total = sum(s["chars"] for s in documents["shards"]["train"])
    doing = (f"Training the {config.kind} tokenizer (vocab {config.vocab_size:,}) on "
             f"{min(total, config.max_bytes) / 1e6:,.1f} MB of text")
    in_log = not getattr(console, "is_terminal", True)  # a log shows no spinner: say when this long stage starts
    if in_log:
        console.print(f"{doing}...", highlight=False)
    started = time.perf_counter()
    with console.status(f"{doing}..."):
        stats = train_tokenizer(sample_documents(paths, total, config), config, target)
    if in_log:
        console.print(f"Tokenizer trained in {human_seconds(time.perf_counter() - started)}.", highlight=False)
    if stats["vocab_size"] < config.vocab_size:
        console.print(f"[yellow]Note:[/] the corpus supports only {stats['vocab_size']:,} of the "
                      f"{config.vocab_size:,} requested tokens; the vocabulary is smaller (the manifest "
                      f"records the real size, which training uses).")
    return stats
