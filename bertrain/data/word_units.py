"""Word units for whole-word and n-gram masking, computed by `prepare` and stored with the shards: a token starts a
word where the tokenizer marks one ("##", "▁"), except in Chinese and Japanese documents, which have no spaces:
there a segmenter (rjieba; fugashi + unidic-lite) finds the words and a token starts one where its first character
starts a segmenter word."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import numpy as np

from bertrain.errors import DataError

HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
KANA = "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_UNSPACED = re.compile(f"[{HAN}{KANA}]")
_KANA = re.compile(f"[{KANA}]")
_WORD_CHAR = re.compile(r"\w")
_SPACE = re.compile(r"\s")
UNSPACED_SHARE = 0.3   # `auto`: a document is segmented when at least this share of its letters is Han or kana,
KANA_SHARE = 0.05      # and it is Japanese when at least this share of those is kana (Chinese has none)
SEGMENTERS = ("zh", "ja")
# What each segmenter needs: (module imported, pip extra that installs it, name for messages).
REQUIREMENTS = {"zh": ("rjieba", "zh", "rjieba with OpenCC (Chinese words)"),
                "ja": ("fugashi", "ja", "fugashi with the unidic-lite dictionary (Japanese words)")}


def document_language(text: str, setting: str) -> Optional[str]:
    """The segmenter a document needs ("zh", "ja") or None (spaced text), by `prepare.word_segmenter`."""
    if setting in SEGMENTERS:
        return setting
    if setting == "none" or not _UNSPACED.search(text):
        return None
    unspaced = len(_UNSPACED.findall(text))
    if unspaced < UNSPACED_SHARE * len(_WORD_CHAR.findall(text)):
        return None
    return "ja" if len(_KANA.findall(text)) >= KANA_SHARE * unspaced else "zh"


def _missing(language: str, error: Exception) -> DataError:
    module, extra, what = REQUIREMENTS[language]
    return DataError(f"This corpus has {'Chinese' if language == 'zh' else 'Japanese'} documents: their word units "
                     f"for whole-word and n-gram masking come from {what}, which cannot be loaded ({error}). "
                     f"Install it with `pip install 'bertrain[{extra}]'`, or set `prepare.word_segmenter: none` in "
                     f"the recipe (words are then the tokenizer's: each Chinese character, or each unspaced run).")


def _chinese(tokenize: Callable, to_simplified: Callable[[str], str]) -> Callable[[str], list[tuple[int, int]]]:
    """jieba's dictionary is of simplified Chinese: traditional text is segmented in its simplified spelling,
    character for character (measured on UD Chinese PUD, traditional: 13.5% -> 5.5% of units part of a word)."""
    def chinese(sentence: str) -> list[tuple[int, int]]:
        simplified = to_simplified(sentence)
        text = simplified if len(simplified) == len(sentence) else sentence
        return [(start, end) for _, start, end in tokenize(text)]

    return chinese


def _load(language: str) -> Callable[[str], list[tuple[int, int]]]:
    """A function sentence -> character spans of its words, for "zh" or "ja"."""
    try:
        if language == "zh":
            import opencc
            import rjieba

            return _chinese(rjieba.tokenize, opencc.OpenCC("t2s").convert)
        import fugashi

        tagger = fugashi.Tagger()   # finds unidic-lite (or a full unidic) by itself
    except (ImportError, RuntimeError) as error:   # fugashi raises RuntimeError when it finds no dictionary
        raise _missing(language, error) from None

    def japanese(sentence: str) -> list[tuple[int, int]]:
        spans, position = [], 0
        for word in tagger(sentence):   # MeCab skips spaces: find each surface from where the last one ended
            start = sentence.find(word.surface, position)
            if start < 0:
                continue
            position = start + len(word.surface)
            spans.append((start, position))
        return spans

    return japanese


class WordSegmenter:
    """Word spans of sentences, loading each segmenter the first time a document needs it."""

    def __init__(self) -> None:
        self._cut: dict[str, Callable[[str], list[tuple[int, int]]]] = {}

    def spans(self, language: str, sentence: str) -> list[tuple[int, int]]:
        """Character spans of the words of a sentence; spaces are not words."""
        if language not in self._cut:
            self._cut[language] = _load(language)
        return [(start, end) for start, end in self._cut[language](sentence)
                if not _SPACE.fullmatch(sentence[start:end] or " ")]


def segmented_word_starts(offsets: list[tuple[int, int]], spans: list[tuple[int, int]], length: int) -> np.ndarray:
    """[tokens] bool: does each token (character offsets) start a unit? A token whose first word character begins
    a word of `spans` does; one that begins inside a word continues the unit (so a token across a word boundary
    joins the words it touches); a token without a word character (a bare "▁", a space) starts the next word."""
    in_word = [False] * (length + 1)
    begins = [False] * (length + 1)
    for start, end in spans:
        in_word[start:end] = [True] * (end - start)
        begins[start] = True
    flags: list[Optional[bool]] = []
    seen = 0   # a prepended "▁" maps to the first character, which the next token maps to again
    for start, end in offsets:
        new = range(max(start, seen), end)
        first = next((char for char in new if in_word[char]), None)
        flags.append(False if not new else None if first is None else begins[first])
        seen = max(seen, end)
    starts = []
    for index, flag in enumerate(flags):
        after_space = index > 0 and flags[index - 1] is None     # the space before started this unit
        if flag is None:
            flag = next((later for later in flags[index + 1:] if later is not None), True)
        starts.append(bool(flag) and not after_space)
    return np.asarray(starts, dtype=bool)


def word_starts_for(tokenizer: Any, sentences: list[str], languages: list[Optional[str]], ids: np.ndarray,
                    sizes: np.ndarray, table: np.ndarray, segmenter: WordSegmenter) -> tuple[np.ndarray, int]:
    """(word start of each token of the sentences' concatenated `ids`, segmenter words counted): the tokenizer's
    marks (`table` by token id) in spaced sentences, the segmenter's words in the others (encoded again, with
    offsets)."""
    starts = table[ids]
    unspaced = [index for index, language in enumerate(languages) if language is not None]
    words = 0
    if unspaced:
        first = np.concatenate([[0], np.cumsum(sizes)])
        encodings = tokenizer.encode_batch([sentences[i] for i in unspaced], add_special_tokens=False)
        for index, encoding in zip(unspaced, encodings):
            spans = segmenter.spans(languages[index], sentences[index])
            words += len(spans)
            starts[first[index]:first[index + 1]] = segmented_word_starts(encoding.offsets, spans,
                                                                          len(sentences[index]))
    return starts, words
