"""The pydoc corpus: English prose that ships with CPython (`pydoc_data.topics`), read by the `pydoc` source
format and written as files for the tests, benchmarks and `bertrain demo`."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

from pydoc_data.topics import topics

JSONL_FILE_CHARS = 50_000_000  # characters per .jsonl file of a sized corpus
PYDOC_SOURCE = "pydoc_data.topics"  # the path a `format: pydoc` source names


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of a pydoc topic that are prose (not indented code or underlined headings)."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if line.strip()]
        if lines and not lines[0].startswith(" ") and not set(lines[-1].strip()) <= set("*=-~"):
            paragraphs.append("\n".join(lines))
    return paragraphs


def all_paragraphs(text: str) -> list[str]:
    """Every non-blank paragraph of a pydoc topic, code and headings included, as written."""
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def pydoc_paragraphs() -> list[str]:
    """Prose paragraphs of CPython's pydoc_data.topics (the reference manual), in a fixed order."""
    return [paragraph for key in sorted(topics) for paragraph in prose_paragraphs(topics[key])]


def pydoc_documents(*, prose_only: bool = True, max_chars: Optional[int] = None) -> list[tuple[str, str]]:
    """(name, text) documents in sorted topic order: one per topic, or with `max_chars` consecutive paragraphs up
    to max_chars, so that no huge topic decides the hash-based validation split."""
    paragraphs_of = prose_paragraphs if prose_only else all_paragraphs
    documents: list[tuple[str, str]] = []
    for key in sorted(topics):
        paragraphs = paragraphs_of(topics[key])
        if max_chars is None:
            if paragraphs:
                documents.append((f"topic-{key}", "\n\n".join(paragraphs)))
            continue
        chunk: list[str] = []
        size = 0
        for paragraph in paragraphs:
            chunk.append(paragraph)
            size += len(paragraph)
            if size >= max_chars:
                documents.append((f"{key}-{len(documents):04d}", "\n\n".join(chunk)))
                chunk, size = [], 0
        if chunk:
            documents.append((f"{key}-{len(documents):04d}", "\n\n".join(chunk)))
    return documents


def write_pydoc_corpus(out_dir: str | Path, size_mb: Optional[float] = None, seed: int = 0,
                       paragraphs_per_document: tuple[int, int] = (4, 24), *, prose_only: bool = True,
                       max_chars: Optional[int] = None) -> dict[str, int]:
    """Write the pydoc corpus as a source: one .txt per document, or with `size_mb` JSON lines of shuffled
    paragraphs (files <= 50 MB) up to that size. Returns its documents, bytes and words."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if size_mb is not None:
        return _write_sized_jsonl(out, size_mb, seed, paragraphs_per_document)
    documents = pydoc_documents(prose_only=prose_only, max_chars=max_chars)
    total = 0
    for name, text in documents:
        data = (text + "\n").encode("utf-8")
        (out / f"{re.sub(r'[^A-Za-z0-9_-]+', '_', name)}.txt").write_bytes(data)
        total += len(data)
    return {"documents": len(documents), "bytes": total, "words": sum(len(text.split()) for _, text in documents)}


def _write_sized_jsonl(out: Path, size_mb: float, seed: int,
                       paragraphs_per_document: tuple[int, int]) -> dict[str, int]:
    """JSON lines of shuffled prose paragraphs until about size_mb million characters are written."""
    rng = random.Random(seed)
    paragraphs = pydoc_paragraphs()
    target, written, file_index = int(size_mb * 1e6), 0, 0
    summary = {"documents": 0, "bytes": 0, "words": 0}
    while written < target:
        with open(out / f"pydoc-{file_index:04d}.jsonl", "w", encoding="utf-8") as handle:
            in_file = 0
            while written < target and in_file < JSONL_FILE_CHARS:
                count = rng.randint(*paragraphs_per_document)
                text = "\n\n".join(rng.choice(paragraphs) for _ in range(count))
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                handle.write(line)
                written += len(line)
                in_file += len(line)
                summary["documents"] += 1
                summary["bytes"] += len(line.encode("utf-8"))
                summary["words"] += len(text.split())
        file_index += 1
    return summary


def pydoc_source_identity() -> tuple[int, int]:
    """(characters, a 48-bit content hash) of the built-in pydoc source: its size for progress and
    what stands for a file's mtime in prepare's stage key (another Python, other topics)."""
    documents = pydoc_documents()
    digest = hashlib.sha256("\0".join(f"{name}\0{text}" for name, text in documents).encode("utf-8"))
    return sum(len(text) for _, text in documents), int(digest.hexdigest()[:12], 16)


def pydoc_source_documents(item: Any, counts: Counter) -> Iterator[tuple]:
    """Raw "text" documents of the built-in pydoc source: one per topic, paragraphs as written."""
    for name, text in pydoc_documents():
        counts["documents_read"] += 1
        yield "text", text, f"{item.path}#{name}"
