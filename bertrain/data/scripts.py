"""Which writing system a text is in, from Unicode ranges (cheap: no language model): picks the sentence
splitter per paragraph, so mixed-language corpora need no per-document tags."""

from __future__ import annotations

import re

# Letters of each script (main blocks; enough to tell which one dominates a paragraph).
SCRIPT_RANGES = {
    "latin": "A-Za-z\u00c0-\u024f\u1e00-\u1eff",
    "cyrillic": "\u0400-\u052f",
    "greek": "\u0370-\u03ff\u1f00-\u1fff",
    "armenian": "\u0530-\u058f",
    "hebrew": "\u0590-\u05ff",
    "arabic": "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff",
    "devanagari": "\u0900-\u097f",
    "bengali": "\u0980-\u09ff",
    "tamil": "\u0b80-\u0bff",
    "telugu": "\u0c00-\u0c7f",
    "thai": "\u0e00-\u0e7f",
    "lao": "\u0e80-\u0eff",
    "myanmar": "\u1000-\u109f",
    "georgian": "\u10a0-\u10ff",
    "hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "ethiopic": "\u1200-\u139f",
    "khmer": "\u1780-\u17ff",
    "kana": "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f",
    "han": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
}
# The language a script's text is split as when a library needs one (sentencex) and the recipe names none.
SCRIPT_LANGUAGE = {"latin": "en", "cyrillic": "ru", "greek": "el", "armenian": "hy", "hebrew": "he", "arabic": "ar",
                   "devanagari": "hi", "bengali": "bn", "tamil": "ta", "telugu": "te", "thai": "th", "lao": "lo",
                   "myanmar": "my", "georgian": "ka", "hangul": "ko", "ethiopic": "am", "khmer": "km", "kana": "ja",
                   "han": "zh"}
SAMPLE_CHARS = 2000  # a paragraph's script is judged on its first characters
_SCRIPT_LETTERS = {script: re.compile(f"[{ranges}]") for script, ranges in SCRIPT_RANGES.items()}
_THAI = _SCRIPT_LETTERS["thai"]


def script_counts(text: str) -> dict[str, int]:
    """Letters of each script in the first SAMPLE_CHARS characters of `text` (scripts with none left out)."""
    sample = text[:SAMPLE_CHARS]
    if sample.isascii():
        return {"latin": sum(char.isalpha() for char in sample)} if any(map(str.isalpha, sample)) else {}
    counts = {script: len(letters.findall(sample)) for script, letters in _SCRIPT_LETTERS.items()}
    return {script: count for script, count in counts.items() if count}


def dominant_script(text: str) -> str:
    """The script with the most letters (`kana` for Japanese: Han with a tenth or more kana); "" when none."""
    counts = script_counts(text)
    if not counts:
        return ""
    if counts.get("kana", 0) * 10 >= counts.get("han", 0) + counts.get("kana", 0) > 0:
        counts["kana"] += counts.pop("han", 0)
    return max(counts, key=counts.get)


def has_thai(text: str) -> bool:
    """Whether any Thai letter is in `text` (a fast scan before counting scripts)."""
    return _THAI.search(text) is not None
