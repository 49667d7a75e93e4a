"""Normalizing raw documents into sentences (runs in worker processes): cleaning, sentence splitting,
short and long sentences, and the content hash used for dedup and the train/validation split."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any, Optional

from bertrain.data.sentences import is_thai, split_sentences, thai_splitter_available

# Zero-width non-joiner and joiner (U+200C, U+200D) stay: Persian and Indic spelling and emoji sequences need them.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b\u2060\ufeff\ufffe]")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")


def clean_text(text: str) -> str:
    """Remove control and invisible format characters (keeping tab and newline)."""
    return _CONTROL.sub("", text)


def _cleaned(text: str, counts: Counter) -> str:
    """clean_text, counting the characters read and those it removed (the share prepare reports)."""
    cleaned = clean_text(text)
    counts["chars_read"] += len(text)
    counts["chars_removed_cleaning"] += len(text) - len(cleaned)
    return cleaned


def normalize_document(kind: str, payload: Any, min_sentence_chars: int, max_line_chars: int,
                       counts: Counter, splitter: str = "auto", language: Optional[str] = None) -> list[str]:
    """Clean a raw document and split it into sentences (each a single line of text)."""
    if kind == "sentences":
        sentences = [" ".join(_cleaned(line, counts).split()) for line in payload]
    else:
        text = _cleaned(payload.replace("\r\n", "\n").replace("\r", "\n"), counts)
        sentences = []
        for paragraph in _PARAGRAPH_BREAK.split(text):
            sentences.extend(split_sentences(paragraph, splitter, language))
            if splitter == "auto" and language is None and is_thai(paragraph) and not thai_splitter_available():
                counts["paragraphs_thai_without_splitter"] += 1
    out = []
    for sentence in sentences:
        if len(sentence) < max(1, min_sentence_chars):
            if sentence:
                counts["sentences_short_dropped"] += 1
            continue
        if len(sentence) > max_line_chars:
            counts["sentences_split_long"] += 1
            out.extend(sentence[i:i + max_line_chars] for i in range(0, len(sentence), max_line_chars))
        else:
            out.append(sentence)
    return out


def document_hash(sentences: list[str]) -> bytes:
    """16-byte content hash of a normalized document (dedup and the train/validation split)."""
    return hashlib.blake2b("\n".join(sentences).encode("utf-8"), digest_size=16).digest()


def normalize_batch(batch: list[tuple], min_sentence_chars: int, max_line_chars: int, splitter: str = "auto",
                    language: Optional[str] = None) -> tuple[list, Counter]:
    """Normalize raw documents: [(sentences, hash)] plus the counts of what was dropped."""
    counts: Counter = Counter()
    out = []
    for kind, payload, _origin in batch:
        sentences = normalize_document(kind, payload, min_sentence_chars, max_line_chars, counts, splitter, language)
        out.append((sentences, document_hash(sentences) if sentences else b""))
    return out, counts
