"""The plain-text reader: sentence-per-line files (BERT's format) or paragraphs, guessed or configured."""

from __future__ import annotations

from collections import Counter
from itertools import chain
from typing import Iterator

from bertrain.config import PrepareConfig, SourceConfig
from bertrain.data.sentences import CLOSING_MARKS, TERMINAL_MARKS, is_thai, split_by_rules
from bertrain.data.sources.lookup import InputFile


MAX_THAI_SENTENCE_CHARS = 300  # Thai marks no sentence ends: a line this short may be one (UD Thai: 99% are)
GUESSED_LAYOUTS = ("sentence_per_line", "paragraphs")


def guessed_layout_count(layout: str) -> str:
    """The count of text files `text_layout: auto` read with `layout` (prepare says per source what it chose)."""
    return f"files_text_layout_auto_{layout}"


def _ends_sentence(line: str) -> bool:
    """Whether a line ends like a sentence: terminal punctuation of any script (before closing quotes or brackets:
    a bare ")" ends "str.capitalize()", which took wrapped prose with such lines for one sentence per line), or a
    short line of Thai."""
    ends = line.rstrip(CLOSING_MARKS).endswith(tuple(TERMINAL_MARKS))
    return ends or (len(line) <= MAX_THAI_SENTENCE_CHARS and is_thai(line))


def guess_text_layout(lines: list[str]) -> str:
    """`sentence_per_line` when nearly every line is one complete sentence, else `paragraphs`."""
    nonblank = [line.rstrip() for line in lines if line.strip()]
    if not nonblank:
        return "paragraphs"
    ends = sum(map(_ends_sentence, nonblank)) / len(nonblank)
    multi = sum(len(split_by_rules(line)) > 1 for line in nonblank) / len(nonblank)
    return "sentence_per_line" if ends >= 0.8 and multi <= 0.2 else "paragraphs"


def text_documents(item: InputFile, lines: Iterator[tuple[int, str]], source: SourceConfig,
                   config: PrepareConfig, counts: Counter) -> Iterator[tuple]:
    """Raw documents of a text file: blank-line-separated blocks, or the whole file cut at paragraph boundaries."""
    layout = source.text_layout
    if layout == "auto":
        head = []
        for pair in lines:
            head.append(pair)
            if len(head) >= 400:
                break
        layout = guess_text_layout([line for _, line in head])
        counts[guessed_layout_count(layout)] += 1
        lines = chain(head, lines)
    if layout == "sentence_per_line":
        document, start = [], 0
        for number, line in lines:
            if line.strip():
                if not document:
                    start = number
                document.append(line)
            elif document:
                yield "sentences", document, f"{item.path}:{start}"
                document = []
        if document:
            yield "sentences", document, f"{item.path}:{start}"
        return
    # paragraphs: the file is one document; very long files are cut at a paragraph boundary
    document, size, start = [], 0, 1
    for number, line in lines:
        if size >= config.max_document_chars and not line.strip():
            counts["documents_cut_long"] += 1
            yield "text", "\n".join(document), f"{item.path}:{start}"
            document, size, start = [], 0, number + 1
            continue
        document.append(line)
        size += len(line) + 1
    if document or start == 1:
        yield "text", "\n".join(document), f"{item.path}:{start}"
