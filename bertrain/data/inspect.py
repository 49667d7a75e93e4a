"""`bertrain inspect DATA_DIR`: the manifest summary, length histograms and a few decoded documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from bertrain.data.format import open_prepared
from bertrain.data.prepare.report import token_rate_row
from bertrain.data.split_index import index_split
from bertrain.tokenizer_file import load_tokenizer


def histogram_rows(lengths: np.ndarray, width: int = 40) -> list[tuple[str, int, str]]:
    """(bin label, count, bar) rows over power-of-two bins of lengths."""
    if lengths.size == 0:
        return []
    top = int(lengths.max())
    edges = [0, 1]
    while edges[-1] <= top:
        edges.append(edges[-1] * 2)
    counts, _ = np.histogram(lengths, bins=edges)
    rows = []
    peak = max(int(counts.max()), 1)
    first = int(np.flatnonzero(counts)[0])  # leading empty bins say nothing
    for low, high, count in list(zip(edges[:-1], edges[1:], counts))[first:]:
        label = f"{low}" if high - low == 1 else f"{low}-{high - 1}"
        rows.append((label, int(count), "█" * int(round(width * count / peak))))
    return rows


def show_data_summary(data_dir: str | Path, console: Any, num_documents: int = 3) -> None:
    """Print the manifest summary, sentence/document length histograms and decoded documents."""
    prepared = open_prepared(data_dir)
    manifest = prepared.manifest
    tokenizer = manifest["tokenizer"]
    summary = Table(title=f"{prepared.path}", show_header=False)
    summary.add_column("key", style="cyan")
    summary.add_column("value")
    summary.add_row("fingerprint", prepared.fingerprint)
    summary.add_row("tokenizer", f"{tokenizer['kind']} (word marker {tokenizer['word_marker']!r}), "
                                 f"{tokenizer['vocab_size']:,} tokens, sha256 {tokenizer['sha256'][:12]}")
    summary.add_row("special tokens", ", ".join(f"{k}={v}" for k, v in tokenizer["special_tokens"].items()))
    stats = tokenizer.get("stats", {})
    if stats:
        summary.add_row("unknown-token rate", f"{stats.get('unk_rate', 0):.4%} ({stats.get('measured_on')})")
        summary.add_row(*token_rate_row(stats, manifest.get("counts", {})))
    summary.add_row("token dtype", manifest["token_dtype"])
    for name, split in manifest["splits"].items():
        summary.add_row(name, f"{split['documents']:,} documents, {split['sentences']:,} sentences, "
                              f"{split['tokens']:,} tokens in {len(split['shards'])} shard(s)")
    sources = manifest.get("sources", [])
    summary.add_row("sources", f"{len(sources)} input(s), {sum(s.get('bytes', 0) for s in sources) / 1e6:,.1f} MB")
    for key, value in manifest.get("counts", {}).items():
        summary.add_row(f"count: {key}", f"{value:,}")
    console.print(summary)

    train = prepared.split("train")
    index = index_split(train)
    for title, lengths in (("sentence length (tokens)", np.diff(index.sentence_cum)),
                           ("document length (tokens)", np.diff(index.sentence_cum[index.document_first]))):
        if lengths.size == 0:
            continue
        table = Table(title=f"train {title}: mean {lengths.mean():.1f}, median {np.median(lengths):.0f}, "
                            f"max {lengths.max()}")
        table.add_column("tokens", justify="right")
        table.add_column("count", justify="right")
        table.add_column("")
        for label, count, bar in histogram_rows(lengths):
            table.add_row(label, f"{count:,}", bar)
        console.print(table)

    if num_documents <= 0:
        return
    tokenizer_object = load_tokenizer(prepared.tokenizer_dir)
    shown = 0
    for shard in train.shards:
        documents = np.asarray(shard.document_offsets)
        sentences = np.asarray(shard.sentence_offsets)
        for index in range(len(documents) - 1):
            if shown >= num_documents:
                return
            first, last = int(documents[index]), int(documents[index + 1])
            console.rule(f"{shard.name} document {index}: {last - first} sentences, "
                         f"{int(sentences[last] - sentences[first])} tokens")
            for sentence in range(first, min(last, first + 8)):
                ids = np.asarray(shard.tokens[sentences[sentence]:sentences[sentence + 1]]).tolist()
                # Special tokens shown: an [UNK] is a character the vocabulary lacks, not a gap in the text.
                text = tokenizer_object.decode(ids, skip_special_tokens=False)
                console.print(f"  {text}", markup=False, highlight=False)
            if last - first > 8:
                console.print(f"  ... {last - first - 8} more sentences")
            shown += 1
