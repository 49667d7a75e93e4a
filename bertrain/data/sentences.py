"""Sentence splitting for any script: one rule set for every script that marks sentence ends (spaced `. ! ? …`,
CJK `。！？`, Devanagari `। ॥`, Arabic `؟ ۔`, ...), and pythainlp for Thai, which marks none (optional extra);
or sentencex (~300 languages) when a recipe asks for it. The splitter is chosen per paragraph by its script."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Callable, Optional

from bertrain.data.scripts import SCRIPT_LANGUAGE, dominant_script, has_thai
from bertrain.errors import UsageError

EXTRAS = {"pythainlp": "bertrain[thai]", "sentencex": "bertrain[sentencex]"}  # what to pip install for each

# Periods after these never end a sentence (titles, and abbreviations always followed by more text).
NEVER_FINAL = frozenset("""
mr mrs ms dr prof sr st rev hon gen col capt lt sgt cpl maj adm gov sen rep pres fr mt
e.g i.e cf vs viz approx ca resp incl
bzw u.a z.b d.h s.o o.ä mio mrd nr hl dt engl frz lat dipl ing
проф акад доц ул см
डॉ
""".split())
# After a day or century number, these words show its period is an ordinal (German "am 3. Oktober"), not an end.
AFTER_ORDINAL = frozenset("""
januar jänner februar märz april mai juni juli august september oktober november dezember
jahrhundert jahrhunderts jahrhunderte jahrtausend jahrtausends
""".split())
# These end a sentence only when the next word is capitalized ("... and so on, etc. The next").
MAYBE_FINAL = frozenset("""
etc inc ltd co corp jr bros dept univ assn est jan feb mar apr jun jul aug sep sept oct nov dec
mon tue wed thu fri sat sun a.m p.m u.s u.k u.n ph.d fig figs eq eqs no nos vol vols pp p ch sec
art ed eds al
""".split())

_CLOSERS = "\"'”’“‘»)\\]}」』）》〉】〕〙〗"  # “ ‘ close German quotations („So?“ Ja.)
CLOSING_MARKS = _CLOSERS  # what may follow a sentence's terminal mark
# Spaced scripts end a sentence with . ! ? … and whitespace; these marks need no space after them: CJK 。！？
# (and fullwidth ．｡), Devanagari danda । ॥, Arabic ؟ and Urdu ۔, Armenian ։, Ethiopic ።, Myanmar ။, Khmer ។ ៕.
_SPACED_END = ".!?…"
_UNSPACED_END = "。！？．｡।॥؟۔։።။។៕"
TERMINAL_MARKS = _SPACED_END + _UNSPACED_END  # what ends a sentence, in every script the rules know
# One character class first: the regex engine then scans fast (about 90 M characters/s); the rest is decided below.
_CANDIDATE = re.compile(f"[{re.escape(_SPACED_END)}{_UNSPACED_END}]+[{re.escape(_CLOSERS)}]*\\s*")
_OPENERS = "\"'“‘«([{「『（《〈【〔"
# A Japanese quotation goes on after its closing bracket when a particle follows: 「…。」と言った.
_QUOTE_PARTICLES = frozenset("とっ")


def _is_cjk(char: str) -> bool:
    return "\u3040" <= char <= "\u9fff" or "\uf900" <= char <= "\ufaff"


def _word_before(text: str, end: int) -> str:
    """The whitespace-delimited word ending at `end` (without the final period), lowercased."""
    start = text.rfind(" ", 0, end) + 1
    return text[start:end].lstrip(_OPENERS).lower()


def _word_at(text: str, start: int) -> str:
    """The word starting at `start`, without trailing punctuation, lowercased."""
    end = text.find(" ", start)
    return text[start:end if end >= 0 else len(text)].rstrip(".,;:!?").lower()


def _is_initial(word: str) -> bool:
    """One letter, in an abugida with its vowel signs (Devanagari बी)."""
    return len(word) <= 3 and word[:1].isalpha() and all(unicodedata.category(char)[0] == "M" for char in word[1:])


def _boundary(text: str, match: re.Match) -> int:
    """Where the sentence ending at this candidate ends (its next one starts), or -1: no boundary here."""
    nxt = match.end()
    if nxt >= len(text):
        return -1
    following = text[nxt]
    found = match.group()
    marks = found.rstrip().rstrip(_CLOSERS)
    if marks[-1] in _UNSPACED_END or (found[-1] != " " and marks[-1] in "!?" and _is_cjk(following)):
        # 。 । ؟ ... need no space after them; nor do ASCII ! ? right before kana or Han. “ ‘ after them open
        # the next sentence (Chinese 。“).
        if following in _QUOTE_PARTICLES and found[-1] in _CLOSERS:
            return -1
        return match.start() + len(found.rstrip(" “‘"))
    if found[-1] != " ":
        return -1  # "3.14", "U.S.A", "out.Really"
    if following in _OPENERS and nxt + 1 < len(text):
        following = text[nxt + 1]
    if following.islower():
        return -1  # "e.g. the", "approx. five", '"Why?" she asked'
    if marks != ".":
        return nxt  # "!", "?", "...", "?!", "।", "。" before a non-lowercase word
    word = _word_before(text, match.start())
    if word in NEVER_FINAL:
        return -1
    if _is_initial(word):
        return -1  # an initial: "John F. Kennedy", Hindi "बी. सी."
    if word.isdigit() and len(word) <= 2 and _word_at(text, nxt) in AFTER_ORDINAL:
        return -1
    if word in MAYBE_FINAL:
        return nxt if following.isupper() else -1
    if "." in word and all(len(part) <= 2 for part in word.split(".")):
        return nxt if following.isupper() else -1  # "U.S.A." style abbreviations
    return nxt


def split_by_rules(text: str) -> list[str]:
    """Split one paragraph at terminal punctuation of any script (whitespace inside is collapsed to single spaces)."""
    text = " ".join(text.split())  # about twice as fast as re.sub(r"\s+", " ", text)
    if not text:
        return []
    sentences = []
    start = 0
    for match in _CANDIDATE.finditer(text):
        end = _boundary(text, match)
        if end >= 0:
            sentence = text[start:end].strip()
            if sentence:
                sentences.append(sentence)
            start = end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


class MissingExtra(UsageError):
    """A splitter's library is not installed; the message names the pip extra."""


@lru_cache(maxsize=None)
def _library_splitter(name: str, language: str) -> Callable[[str], list[str]]:
    """sentencex or pythainlp as a function text -> sentences; MissingExtra when not installed."""
    try:
        if name == "pythainlp":
            from pythainlp.tokenize import sent_tokenize
            sent_tokenize("ทดสอบ")  # its default engine (crfcut) needs python-crfsuite: fail here, not mid-corpus
            return sent_tokenize
        from sentencex import segment
        return lambda text: list(segment(language, text))
    except ImportError as error:
        raise MissingExtra(f"prepare.sentence_splitter {name} needs the {name} package: pip install "
                           f"'{EXTRAS[name]}' ({error})") from error


@lru_cache(maxsize=None)
def thai_splitter_available() -> bool:
    """Whether pythainlp (with python-crfsuite) can split Thai here."""
    try:
        _library_splitter("pythainlp", "th")
        return True
    except MissingExtra:
        return False


def require_splitter(splitter: str) -> None:
    """MissingExtra, naming what to install, when a recipe asks for a library splitter that is not installed."""
    if splitter in EXTRAS:
        _library_splitter(splitter, "th" if splitter == "pythainlp" else "en")


def is_thai(text: str) -> bool:
    """Whether a paragraph is mostly Thai (split by pythainlp under `auto`)."""
    return has_thai(text) and dominant_script(text) == "thai"


def split_sentences(text: str, splitter: str = "auto", language: Optional[str] = None) -> list[str]:
    """Split one paragraph into sentences (whitespace collapsed). `auto`: pythainlp for a Thai paragraph (or
    `language` th) when installed, else the rules; `sentencex` uses `language` (None: the script's language)."""
    if splitter == "auto":
        thai = language == "th" if language else is_thai(text)
        if not thai or not thai_splitter_available():
            return split_by_rules(text)
        splitter = "pythainlp"
    elif splitter == "rules":
        return split_by_rules(text)
    elif language is None:
        language = SCRIPT_LANGUAGE.get(dominant_script(text), "en")
    sentences = _library_splitter(splitter, language or "th")(" ".join(text.split()))
    return [" ".join(sentence.split()) for sentence in sentences if sentence.strip()]
