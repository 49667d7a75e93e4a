"""How much of the text cleaning and the tokenizer's normalizer changed: prepare reports both shares and warns
above WARN_SHARE (e.g. accent stripping deletes 15% of Hindi and 20% of Thai characters)."""

from __future__ import annotations

import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

from bertrain.data.prepare.workdir import WORK

WARN_SHARE = 0.01
SAMPLE_CHARS = 4_000_000   # of the training documents' text: enough for a stable share, fast on any corpus
SHOWN_CHARS = 5            # the most changed characters named in the warning


def _fold(text: str) -> str:
    """Case and compatibility width folded away: lowercasing and NFKC are meant changes, not losses."""
    return unicodedata.normalize("NFKC", text).lower()


def normalizer_changes(tokenizer: Any, text: str) -> dict[str, Any]:
    """Characters of `text` (not spaces) the normalizer deletes or changes beyond case and width, by character."""
    changed: Counter = Counter()
    total = 0
    for char, count in Counter(text).items():
        if char.isspace():
            continue
        total += count
        normalized = tokenizer.normalizer.normalize_str(char) if tokenizer.normalizer else char
        if _fold("".join(normalized.split())) != _fold(char):
            changed[char] = count
    return {"chars_measured": total, "chars_changed": sum(changed.values()),
            "most_changed": [char for char, _ in changed.most_common(SHOWN_CHARS)]}


def measure_normalization(out: Path, tokenizer: Any) -> dict[str, Any]:
    """normalizer_changes on up to SAMPLE_CHARS of the training documents' text ({} when they were removed)."""
    text = ""
    for path in sorted((out / WORK / "documents" / "train").glob("*.txt")):
        with open(path, encoding="utf-8") as handle:
            text += handle.read(SAMPLE_CHARS - len(text))
        if len(text) >= SAMPLE_CHARS:
            break
    return normalizer_changes(tokenizer, text) if text else {}


def normalization_row_and_warning(counts: dict[str, Any], stats: dict[str, Any]) -> tuple[tuple[str, str], list[str]]:
    """The closing table's row (shares changed by cleaning and normalization) and a warning above WARN_SHARE."""
    cleaning = counts.get("chars_removed_cleaning", 0) / max(counts.get("chars_read", 0), 1)
    measured = stats.get("normalization") or {}
    normalized = measured.get("chars_changed", 0) / max(measured.get("chars_measured", 0), 1)
    row = ("characters changed: cleaning, normalization", f"{cleaning:.2%}, " + (
        f"{normalized:.2%} (of {measured['chars_measured']:,})" if measured else "not measured"))
    if cleaning + normalized <= WARN_SHARE:
        return row, []
    examples = ", ".join(f"{char!r} U+{ord(char):04X}" for char in measured.get("most_changed", []))
    return row, [
        f"{cleaning + normalized:.1%} of the characters were changed: cleaning removed {cleaning:.2%} (control "
        f"and invisible format characters) and the tokenizer's normalization deleted or changed {normalized:.2%} "
        f"(beyond lowercasing and compatibility forms)" + (f", most often {examples}" if examples else "") +
        ". If that text matters (accents, vowel signs, dakuten), set tokenizer.strip_accents: false (true suits "
        "only BERT-uncased English) and check the source's encoding."]
