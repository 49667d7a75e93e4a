"""Word units for whole-word and n-gram masking, computed by `prepare` and stored with the shards: a token starts a
word where the tokenizer marks one ("##", "▁"), except in Chinese and Japanese documents, which have no spaces:
there a segmenter (rjieba; fugashi + unidic-lite) finds the words and a token starts one where its first character
starts a segmenter word."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import numpy as np

from bertrain.data.scripts import SCRIPT_RANGES
from bertrain.errors import DataError

HAN = SCRIPT_RANGES["han"] + "\U00020000-\U0003134f"   # and the supplementary ideographs (extension B on)
KANA = SCRIPT_RANGES["kana"]
_UNSPACED = re.compile(f"[{HAN}{KANA}]")
_KANA = re.compile(f"[{KANA}]")
_WORD_CHAR = re.compile(r"\w")
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
                if end > start and not sentence[start:end].isspace()]


def segmented_word_starts(offsets: list[list[tuple[int, int]]], spans: list[list[tuple[int, int]]],
                          lengths: list[int]) -> np.ndarray:
    """Word starts of the tokens of several sentences (their character `offsets`, their words' `spans`, their
    `lengths`), concatenated. A token whose first new word character begins a word starts a unit; one that begins
    inside a word continues it (so a token across a word end joins the words it touches); a token without a
    word character (a bare "▁", a space) starts the next word's unit; a sentence's first token starts one."""
    base = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64) + 1)])   # sentences one char apart
    total = int(base[-1])
    sentence = np.repeat(np.arange(len(offsets)), [len(o) for o in offsets])
    tokens = np.array([pair for o in offsets for pair in o], dtype=np.int64).reshape(-1, 2) + base[sentence, None]
    span_sentence = np.repeat(np.arange(len(spans)), [len(s) for s in spans])
    words = np.array([pair for s in spans for pair in s], dtype=np.int64).reshape(-1, 2) + base[span_sentence, None]
    cover = np.zeros(total + 1, dtype=np.int64)
    np.add.at(cover, words[:, 0], 1)
    np.add.at(cover, words[:, 1], -1)
    in_word = np.cumsum(cover) > 0                                          # [total + 1]
    begins = np.zeros(total + 1, dtype=bool)
    begins[words[:, 0]] = True
    # The first word character at or after each position (total + 1 where none is).
    next_word = np.minimum.accumulate(np.where(in_word, np.arange(total + 1), total + 1)[::-1])[::-1]
    next_word = np.append(next_word, total + 1)
    start, end = tokens[:, 0], tokens[:, 1]
    # A prepended "▁" maps to the first character, which the next token maps to again: only new characters count.
    seen = np.maximum.accumulate(np.concatenate([[0], end[:-1]])) if len(end) else end
    new_start = np.maximum(start, seen)
    first = next_word[np.minimum(new_start, total + 1)]
    flag = np.where(new_start >= end, 0, np.where(first < end, begins[np.minimum(first, total)], -1))
    # Tokens without a word character (-1) take the flag of the next token that has one, in the same sentence.
    count = len(flag)
    index = np.where(flag >= 0, np.arange(count), count)
    following = np.minimum.accumulate(index[::-1])[::-1] if count else index
    same = np.append(sentence, -1)[following] == sentence
    filled = np.where(flag >= 0, flag, np.where(same, np.append(flag, 1)[following], 1))
    new_sentence = np.ones(count, dtype=bool)
    new_sentence[1:] = sentence[1:] != sentence[:-1]
    after_space = np.zeros(count, dtype=bool)
    after_space[1:] = (flag[:-1] < 0) & ~new_sentence[1:]                  # the space before started this unit
    return ((filled > 0) & ~after_space) | new_sentence


def encode(tokenizer: Any, sentences: list[str], languages: list[Optional[str]]) -> tuple[list[list[int]], dict]:
    """(token ids of each sentence, {index: character offsets of its tokens} for the sentences to segment):
    offsets cost time, so spaced sentences are encoded without them."""
    unspaced = [index for index, language in enumerate(languages) if language is not None]
    if not unspaced:
        return [e.ids for e in tokenizer.encode_batch_fast(sentences, add_special_tokens=False)], {}
    spaced = [index for index, language in enumerate(languages) if language is None]
    id_lists: list[list[int]] = [[] for _ in sentences]
    for index, encoding in zip(spaced, tokenizer.encode_batch_fast([sentences[i] for i in spaced],
                                                                   add_special_tokens=False)):
        id_lists[index] = encoding.ids
    offsets = {}
    for index, encoding in zip(unspaced, tokenizer.encode_batch([sentences[i] for i in unspaced],
                                                                add_special_tokens=False)):
        id_lists[index], offsets[index] = encoding.ids, encoding.offsets
    return id_lists, offsets


def word_starts_for(sentences: list[str], languages: list[Optional[str]], ids: np.ndarray, sizes: np.ndarray,
                    offsets: dict, tables: tuple[np.ndarray, ...], segmenter: WordSegmenter) -> tuple[np.ndarray, int]:
    """(word start of each token of the sentences' concatenated `ids`, segmenter words counted): in spaced
    sentences the tokenizer's marks (`tables` by token id, see masking.word_tables), a sentence's first token and
    the token after punctuation, not the one after a bare "▁"; the segmenter's words in those with `offsets`."""
    table, punctuation, bare = tables
    starts = table[ids]
    starts[1:] |= punctuation[ids[:-1]]   # Unigram's "(bar": WordPiece's pre-tokenizer starts a word at "bar"
    starts[1:] &= ~bare[ids[:-1]]         # "▁" "$" is one unit, as "▁$" would be, not a space alone
    first = (np.cumsum(sizes) - sizes).astype(np.int64)
    starts[first[first < len(ids)]] = True   # a sentence's first piece may lack "▁" (a quote): not the last word's
    if not offsets:
        return starts, 0
    unspaced = sorted(offsets)
    spans = [segmenter.spans(languages[i], sentences[i]) for i in unspaced]
    first = np.concatenate([[0], np.cumsum(sizes)])
    positions = np.concatenate([np.arange(first[i], first[i + 1]) for i in unspaced])
    starts[positions] = segmented_word_starts([offsets[i] for i in unspaced], spans,
                                              [len(sentences[i]) for i in unspaced])
    return starts, sum(map(len, spans))
