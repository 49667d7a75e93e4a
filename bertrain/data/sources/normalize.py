"""Normalizing raw documents into sentences (runs in worker processes): cleaning, sentence splitting,
short and long sentences, and the content hash used for dedup and the train/validation split."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any

from bertrain.data.sentences import split_sentences

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b-\u200d\u2060\ufeff\ufffe]")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")


def clean_text(text: str) -> str:
    """Remove control and invisible format characters (keeping tab and newline)."""
    return _CONTROL.sub("", text)


def normalize_document(kind: str, payload: Any, min_sentence_chars: int, max_line_chars: int,
                       counts: Counter) -> list[str]:
    """Clean a raw document and split it into sentences (each a single line of text)."""
    if kind == "sentences":
        sentences = [" ".join(clean_text(line).split()) for line in payload]
    else:
        text = clean_text(payload.replace("\r\n", "\n").replace("\r", "\n"))
        sentences = []
        for paragraph in _PARAGRAPH_BREAK.split(text):
            sentences.extend(split_sentences(paragraph))
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


def normalize_batch(batch: list[tuple], min_sentence_chars: int, max_line_chars: int) -> tuple[list, Counter]:
    """Normalize raw documents: [(sentences, hash)] plus the counts of what was dropped."""
    counts: Counter = Counter()
    out = []
    for kind, payload, _origin in batch:
        sentences = normalize_document(kind, payload, min_sentence_chars, max_line_chars, counts)
        out.append((sentences, document_hash(sentences) if sentences else b""))
    return out, counts
