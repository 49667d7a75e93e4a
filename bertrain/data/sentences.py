"""A rule-based sentence splitter for English-like prose: terminal punctuation, optional closing quotes, then
whitespace, unless the next word starts lowercase or the period ends an abbreviation or an initial."""

from __future__ import annotations

import re

# Periods after these never end a sentence (titles, and abbreviations always followed by more text).
NEVER_FINAL = frozenset("""
mr mrs ms dr prof sr st rev hon gen col capt lt sgt cpl maj adm gov sen rep pres fr mt
e.g i.e cf vs viz approx ca resp incl
""".split())
# These end a sentence only when the next word is capitalized ("... and so on, etc. The next").
MAYBE_FINAL = frozenset("""
etc inc ltd co corp jr bros dept univ assn est jan feb mar apr jun jul aug sep sept oct nov dec
mon tue wed thu fri sat sun a.m p.m u.s u.k u.n ph.d fig figs eq eqs no nos vol vols pp p ch sec
art ed eds al
""".split())

_CANDIDATE = re.compile(r"[.!?…]+[\"'”’»)\]}]*\s+")
_OPENERS = "\"'“‘«([{"


def _word_before(text: str, end: int) -> str:
    """The whitespace-delimited word ending at `end` (without the final period), lowercased."""
    start = text.rfind(" ", 0, end) + 1
    return text[start:end].lstrip(_OPENERS).lower()


def _is_boundary(text: str, match: re.Match) -> bool:
    nxt = match.end()
    if nxt >= len(text):
        return False
    following = text[nxt]
    if following in _OPENERS and nxt + 1 < len(text):
        following = text[nxt + 1]
    if following.islower():
        return False  # "e.g. the", "approx. five", '"Why?" she asked'
    punct_end = match.start()
    while punct_end < len(text) and text[punct_end] in ".!?…":
        punct_end += 1
    if text[match.start():punct_end] != ".":
        return True  # "!", "?", "...", "?!" before a non-lowercase word
    word = _word_before(text, match.start())
    if word in NEVER_FINAL:
        return False
    if len(word) == 1 and word.isalpha():
        return False  # an initial: "John F. Kennedy"
    if word in MAYBE_FINAL:
        return following.isupper()
    if "." in word and all(len(part) <= 2 for part in word.split(".")):
        return following.isupper()  # "U.S.A." style abbreviations
    return True


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of text into sentences (whitespace inside is collapsed to single spaces)."""
    text = " ".join(text.split())  # about twice as fast as re.sub(r"\s+", " ", text)
    if not text:
        return []
    sentences = []
    start = 0
    for match in _CANDIDATE.finditer(text):
        if _is_boundary(text, match):
            end = match.end()
            sentence = text[start:end].rstrip()
            if sentence:
                sentences.append(sentence)
            start = end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences
