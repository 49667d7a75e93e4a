"""The closing table of `bertrain prepare`: counts, skips by reason, tokenizer facts, the shape of the
documents (with a warning when most are too short), size and time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from bertrain.data.format import open_prepared
from bertrain.data.prepare.document_shape import document_shape, shape_rows, shape_warnings
from bertrain.data.prepare.documents import DOCUMENT_SKIPS
from bertrain.data.prepare.empty_corpus import WRONG_ENCODINGS, skip_reason
from bertrain.data.prepare.normalization import normalization_row_and_warning
from bertrain.data.sentences import EXTRAS
from bertrain.files import tree_bytes

# Counts shown in the closing table only when nonzero, with their labels.
OPTIONAL_ROWS = (("records_read", "records read (grouped by group_by)"),
                 ("files_skipped_binary", "files skipped: binary (NUL bytes)"),
                 ("files_skipped_utf16", "files skipped: UTF-16 text (convert to UTF-8)"),
                 ("files_skipped_utf32", "files skipped: UTF-32 text (convert to UTF-8)"),
                 ("files_skipped_unknown_format", "files skipped: unknown format"),
                 ("files_empty", "files empty"),
                 ("lines_decode_replaced", "lines with invalid UTF-8 replaced"),
                 ("lines_decode_skipped", "lines with invalid UTF-8 skipped"),
                 ("lines_split_long", "long lines split"),
                 ("sentences_split_long", "long sentences split"),
                 ("documents_cut_long", "long documents cut"),
                 ("sentences_short_dropped", "sentences dropped: too short"),
                 ("sentences_empty_after_tokenizing", "sentences dropped: no tokens"),
                 ("paragraphs_thai_without_splitter", "Thai paragraphs split without pythainlp"),
                 ("documents_segmented_zh", "documents cut into words: Chinese (rjieba)"),
                 ("documents_segmented_ja", "documents cut into words: Japanese (fugashi)"))
# More characters per word than this (English ~6, German ~7, Finnish ~8) means the words are unspaced runs, not
# words (Thai, or Chinese without a segmenter): "tokens per word" then says nothing, tokens per character does.
UNSPACED_CHARS_PER_WORD = 12.0


def token_rate_row(stats: dict[str, Any], counts: dict[str, Any]) -> tuple[str, str]:
    """(label, value) of the tokenizer's rate: tokens per word, with segmenter words where documents were
    segmented, or tokens per character when words are unspaced runs (older manifests: per word)."""
    where = stats.get("measured_on", "?")
    if stats.get("chars_per_word", 0) > UNSPACED_CHARS_PER_WORD:
        return f"tokens per character ({where}; the text has few spaces)", f"{stats.get('tokens_per_char', 0):.3f}"
    segmented = counts.get("documents_segmented_zh", 0) + counts.get("documents_segmented_ja", 0)
    words = f"; words of {segmented:,} zh/ja documents by their segmenter" if segmented else ""
    return f"tokens per word ({where}{words})", f"{stats.get('tokens_per_word', 0):.3f}"


def _count_rows(manifest: dict[str, Any]) -> list[tuple[str, int]]:
    counts = manifest["counts"]
    splits = manifest["splits"]
    rows = [
        ("files read", counts.get("files_read", 0)),
        ("documents read", counts.get("documents_read", 0)),
        ("documents written: train", splits["train"]["documents"]),
        ("documents written: validation", splits["validation"]["documents"]),
    ]
    for reason in DOCUMENT_SKIPS:
        rows.append((f"documents skipped: {reason.removeprefix('documents_').replace('_', ' ')}",
                     counts.get(reason, 0)))
    for name, label in OPTIONAL_ROWS:
        if counts.get(name):
            rows.append((label, counts[name]))
    rows += [("sentences", counts.get("sentences_written", 0)),
             ("tokens: train", splits["train"]["tokens"]), ("tokens: validation", splits["validation"]["tokens"])]
    return rows


def layout_lines(text_layouts: list[dict[str, Any]]) -> list[str]:
    """Per source that `text_layout: auto` read, the layouts it chose: one document per file is easy to miss."""
    lines = []
    for entry in text_layouts:
        where = f"source {entry['source']} ({entry['path']})"
        chosen = [f"{entry[layout]:,} file(s) as {layout}" for layout in ("paragraphs", "sentence_per_line")
                  if entry.get(layout)]
        line = f"text_layout auto read {where}: {' and '.join(chosen)}"
        option = f"--set prepare.sources.{entry['source']}.text_layout"
        if entry.get("paragraphs") and entry.get("sentence_per_line"):  # files of one corpus read two ways
            line += (" (paragraphs: each file is one document; sentence_per_line: one sentence a line, blank lines "
                     f"between documents); when its files share one layout, say which: {option}=paragraphs or "
                     f"{option}=sentence_per_line")
        elif entry.get("paragraphs"):
            line += (" (their lines are not one sentence each, so each file is one document and its blank lines "
                     f"separate paragraphs); if blank lines separate documents there, pass {option}=sentence_per_line "
                     "(each line then is one sentence)")
        lines.append(line + ".")
    return lines


def empty_validation_warning(manifest: dict[str, Any]) -> list[str]:
    """A warning when validation was asked for but got no document: pretrain would find out only at its first
    evaluation, which it then skips."""
    fraction = manifest.get("settings", {}).get("prepare", {}).get("validation_fraction", 0)
    splits = manifest["splits"]
    if not fraction or splits["validation"]["documents"]:
        return []
    return [f"the validation split has 0 documents: prepare.validation_fraction {fraction} of "
            f"{splits['train']['documents']:,} document(s) (each placed by its hash) gave none, so pretrain's "
            f"evaluation will be skipped. Raise --validation-fraction, or give the corpus more documents."]


def encoding_warnings(skipped: list[dict[str, str]]) -> list[str]:
    """A warning for each file skipped as UTF-16/32 text: unlike a binary file, converting it makes it usable."""
    return [f"{entry['path']}: {skip_reason(entry['path'], entry['reason'])}" for entry in skipped
            if entry["reason"] in WRONG_ENCODINGS]


def report(manifest: dict[str, Any], out: Path, console: Any, seconds: float, timings: dict[str, float],
           text_layouts: list[dict[str, Any]] = ()) -> list[str]:
    """Print the preparation's counts, skips, layouts chosen, tokenizer, shape, size and time; return the warnings
    (changed characters, short documents, Thai without its splitter, no validation, UTF-16 files)."""
    table = Table(title=f"Prepared {out}", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    for label, value in _count_rows(manifest):
        table.add_row(label, f"{value:,}")
    shape = document_shape(open_prepared(out))
    for label, text in shape_rows(shape):
        table.add_row(label, text)
    tokenizer = manifest["tokenizer"]
    stats = tokenizer.get("stats", {})
    table.add_row("tokenizer", f"{tokenizer['kind']} ({tokenizer['word_marker']}), {tokenizer['vocab_size']:,} tokens")
    table.add_row(f"unknown-token rate ({stats.get('measured_on', '?')})", f"{stats.get('unk_rate', 0):.4%}")
    table.add_row(*token_rate_row(stats, manifest.get("counts", {})))
    normalization_row, warnings = normalization_row_and_warning(manifest["counts"], stats)
    table.add_row(*normalization_row)
    table.add_row("output size", f"{tree_bytes(out) / 1e6:,.1f} MB")
    table.add_row("time", f"{seconds:,.1f} s" + (" (" + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()) + ")"
                                                   if timings else ""))
    console.print(table)
    for line in layout_lines(list(text_layouts)):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if manifest.get("skipped_files"):
        names = ", ".join(f"{s['path']} ({s['reason']})" for s in manifest["skipped_files"][:10])
        console.print(f"Skipped files: {names}" + (" ..." if len(manifest["skipped_files"]) > 10 else ""))
    warnings += shape_warnings(shape, manifest["sources"])
    thai = manifest["counts"].get("paragraphs_thai_without_splitter", 0)
    if thai:
        warnings.append(f"{thai:,} paragraphs of Thai text were split by punctuation rules only, and Thai marks no "
                        f"sentence ends, so each stayed one sentence: install pythainlp (pip install "
                        f"'{EXTRAS['pythainlp']}') and prepare again.")
    warnings += empty_validation_warning(manifest) + encoding_warnings(manifest.get("skipped_files", []))
    for warning in warnings:
        console.print(f"[yellow]Warning:[/] {escape(warning)}", soft_wrap=True, highlight=False)
    return warnings
