"""The error when stage 1 leaves no training document: every input file named with what was wrong
with it, why its documents were dropped, and what to do."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from bertrain.config import PrepareConfig
from bertrain.errors import DataError

MAX_FILES_NAMED = 10
FIX = ("Fix: point --source (or prepare.sources[].path) at files with text in them: plain text (.txt), JSON "
       "lines (.jsonl) or JSON records with a string text field, Parquet, or a datasets directory "
       "(optionally .gz/.zst).")
SKIP_REASONS = {"binary": "binary (a NUL byte in its first 8000 bytes), skipped",
                "unknown_format": "unknown format (set the source's `format:`), skipped"}
WRONG_ENCODINGS = {"utf16": "UTF-16", "utf32": "UTF-32"}  # skip reasons: text with this byte-order mark


def skip_reason(path: str, reason: str) -> str:
    """Why a file was skipped, said for the user: for UTF-16/32 text, the command that converts it."""
    if reason in WRONG_ENCODINGS:
        encoding = WRONG_ENCODINGS[reason]
        converted = Path(path).with_suffix(".utf8" + Path(path).suffix)  # keeps the suffix the format is read from
        return (f"{encoding} text (byte-order mark), skipped; convert it to UTF-8, e.g. iconv -f {encoding} "
                f"-t UTF-8 {shlex.quote(path)} > {shlex.quote(str(converted))}")
    return SKIP_REASONS.get(reason, reason)


def _file_lines(inputs: list[tuple[Any, list]], skipped: list, read_by_file: dict[str, int]) -> list[str]:
    """One line per input file, in reading order (the first MAX_FILES_NAMED): what became of it."""
    reasons = {entry["path"]: skip_reason(entry["path"], entry["reason"]) for entry in skipped}
    lines = []
    for _, items in inputs:
        for item in items:
            read = read_by_file.get(item.path, 0)
            what = (reasons.pop(item.path, None) or ("empty (0 bytes)" if item.size == 0 and item.format != "hub" else
                    "no records or text: only blank lines or whitespace" if read == 0 else
                    f"{read:,} document(s) read, none kept"))
            lines.append(f"  {item.path}: {what}")
    lines += [f"  {path}: {what}" for path, what in reasons.items()]  # files never read (unknown format)
    if len(lines) > MAX_FILES_NAMED:
        lines = lines[:MAX_FILES_NAMED] + [f"  ... and {len(lines) - MAX_FILES_NAMED} more files"]
    return lines


def _why_dropped(counts: Counter, config: PrepareConfig) -> list[str]:
    """Why the documents that were read were dropped, each with its figure and its setting."""
    why = []
    if counts["documents_empty"]:
        why.append(f"{counts['documents_empty']:,} document(s) had no text after cleaning (whitespace, "
                   f"control or invisible characters only)")
    if counts["sentences_short_dropped"]:
        why.append(f"{counts['sentences_short_dropped']:,} sentence(s) were shorter than "
                   f"prepare.min_sentence_chars ({config.min_sentence_chars}) and dropped")
    if counts["documents_bad_record"]:
        grouped = any(source.group_by for source in config.sources)
        why.append(f"{counts['documents_bad_record']:,} record(s) had no usable text"
                   f"{' or lacked a group_by field' if grouped else ''} and were skipped (prepare.on_bad_record: "
                   f"skip); check the source's text_field{' and group_by' if grouped else ''}")
    if counts["lines_decode_skipped"]:
        why.append(f"{counts['lines_decode_skipped']:,} line(s) with invalid UTF-8 were skipped "
                   f"(prepare.on_decode_error: skip)")
    return why


def no_training_documents(counts: Counter, validation_documents: int, config: PrepareConfig,
                          inputs: list[tuple[Any, list]], skipped: list, read_by_file: dict[str, int]) -> DataError:
    """The DataError for a stage 1 that wrote no training document."""
    read = counts["documents_read"]
    if validation_documents:
        return DataError(f"No training documents left: all {validation_documents:,} document(s) went to "
                         f"validation (prepare.validation_fraction {config.validation_fraction}). Add documents, "
                         f"or set --validation-fraction 0.")
    paths = {item.path for _, items in inputs for item in items}
    files = len(paths) + sum(entry["path"] not in paths for entry in skipped)
    head = f"No training documents left after reading {read:,} document(s) from {files:,} file(s):"
    why = _why_dropped(counts, config)
    tail = [("Why: " + "; ".join(why) + ".") if why else "", FIX]
    return DataError("\n".join([head, *_file_lines(inputs, skipped, read_by_file), *[t for t in tail if t]]))
