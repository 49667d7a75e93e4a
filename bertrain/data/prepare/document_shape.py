"""Whether the training documents can make sentence pairs and fill an instance: the figures the
closing report shows, and a warning with the fix when most documents are too short."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bertrain.config import DataConfig
from bertrain.data.format import PreparedData

TYPICAL_MAX_SEQ_LENGTH = DataConfig().max_seq_length  # the default, also tiny_bert's and tiny_albert's
SPECIAL_TOKENS_PER_PAIR = 3                           # [CLS] A [SEP] B [SEP]
WARN_SHARE = 0.5                                      # warn when more than this share is too short (or long)
MAX_DOCUMENTS_PER_SHARD = 200_000                     # a sample bounds the time on very large corpora
RECORD_FORMATS = ("jsonl", "json", "parquet", "arrow", "hub")


@dataclass
class DocumentShape:
    """Sentences and tokens of the (sampled) training documents."""

    documents: int
    one_sentence: int
    short: int             # fewer tokens than fill one max_seq_length instance
    mean_sentences: float
    mean_tokens: float
    sampled: bool
    long_sentences: int = 0      # sentences longer than the content of one pair instance
    long_share: float = 0.0      # their share of the tokens
    max_seq_length: int = TYPICAL_MAX_SEQ_LENGTH

    @property
    def short_below(self) -> int:
        """Content tokens of a full instance: a document with fewer cannot fill one."""
        return self.max_seq_length - SPECIAL_TOKENS_PER_PAIR


def document_shape(prepared: PreparedData, max_seq_length: int = TYPICAL_MAX_SEQ_LENGTH) -> DocumentShape:
    """Sentences and tokens per training document (the first MAX_DOCUMENTS_PER_SHARD of each shard)."""
    sentences, tokens, lengths, sampled = [], [], [], False
    for shard in prepared.split("train").shards:
        documents = np.asarray(shard.document_offsets[:MAX_DOCUMENTS_PER_SHARD + 1])
        sampled |= len(shard.document_offsets) > len(documents)
        sentences.append(np.diff(documents))
        tokens.append(np.diff(np.asarray(shard.sentence_offsets)[documents]))
        lengths.append(np.diff(np.asarray(shard.sentence_offsets[:documents[-1] + 1])))
    length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    long = length > max_seq_length - SPECIAL_TOKENS_PER_PAIR
    per_doc_sentences = np.concatenate(sentences) if sentences else np.zeros(0)
    per_doc_tokens = np.concatenate(tokens) if tokens else np.zeros(0)
    count = len(per_doc_sentences)
    return DocumentShape(
        documents=count, one_sentence=int((per_doc_sentences == 1).sum()),
        short=int((per_doc_tokens < max_seq_length - SPECIAL_TOKENS_PER_PAIR).sum()),
        mean_sentences=float(per_doc_sentences.mean()) if count else 0.0,
        mean_tokens=float(per_doc_tokens.mean()) if count else 0.0, sampled=sampled, max_seq_length=max_seq_length,
        long_sentences=int(long.sum()), long_share=float(length[long].sum() / max(length.sum(), 1)))


def shape_rows(shape: DocumentShape) -> list[tuple[str, str]]:
    """Rows of the closing table: one-sentence and short documents, means per document."""
    share = (lambda n: f"{n:,} ({n / shape.documents:.1%})") if shape.documents else (lambda n: "0")
    where = "train, sampled" if shape.sampled else "train"
    return [(f"documents of 1 sentence ({where})", share(shape.one_sentence)),
            (f"documents < {shape.short_below} tokens ({where})", share(shape.short)),
            ("sentences, tokens per document", f"{shape.mean_sentences:,.2f}, {shape.mean_tokens:,.1f}"),
            (f"sentences > {shape.short_below} tokens ({where})",
             f"{shape.long_sentences:,} ({shape.long_share:.1%} of the tokens)")]


def _fix(sources: list[dict[str, Any]]) -> str:
    """The fix that fits the sources: group records, or put more text in each document."""
    if any(source.get("format") in RECORD_FORMATS for source in sources):
        return ("if each record is a piece of a longer text (a verse, a line, a paragraph), group consecutive "
                "records into documents with the source's `group_by` (e.g. `group_by: [book, chapter]` in the recipe, "
                "or --set 'prepare.sources.0.group_by=[book,chapter]')")
    return ("put whole texts in each document: with one sentence per line, blank lines only between "
            "documents (text_layout: sentence_per_line), or one document per file (text_layout: paragraphs)")


def shape_warnings(shape: DocumentShape, sources: list[dict[str, Any]]) -> list[str]:
    """A warning, with the figure and the fix, for each way most documents are too short."""
    if not shape.documents:
        return []
    warnings = []
    if shape.one_sentence > WARN_SHARE * shape.documents:
        warnings.append(
            f"{shape.one_sentence / shape.documents:.0%} of the {shape.documents:,} training documents have one "
            f"sentence (mean {shape.mean_sentences:.2f}): NSP and SOP take both segments of a pair from one "
            f"document, so they get almost no real pairs. Fix: {_fix(sources)}; or train without the sentence "
            f"task (--set data.objective=none).")
    if shape.short > WARN_SHARE * shape.documents:
        warnings.append(
            f"{shape.short / shape.documents:.0%} of the {shape.documents:,} training documents have fewer than "
            f"{shape.short_below} tokens (mean {shape.mean_tokens:.0f}), so they cannot fill one instance of "
            f"{shape.max_seq_length} tokens (data.max_seq_length's default, also tiny_bert's and tiny_albert's; "
            f"{SPECIAL_TOKENS_PER_PAIR} go to [CLS]/[SEP]): batches will be mostly padding. Fix: {_fix(sources)}; "
            f"or train with a shorter data.max_seq_length (e.g. --set data.max_seq_length=64).")
    if shape.long_share > WARN_SHARE:
        warnings.append(f"{shape.long_share:.0%} of the training tokens are in sentences longer than "
                        f"{shape.short_below} tokens (one pair at max_seq_length {shape.max_seq_length}): their pieces "
                        f"train MLM only. If that is prose the splitter missed (no . ! ? and space), give one sentence "
                        f"per line.")
    return warnings
