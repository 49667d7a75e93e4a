"""Dynamic masking (token, whole_word, ngram units; 80/10/10 once per unit). As Google's create_pretraining_data,
each sequence gets round(mlm_probability x its tokens) predictions (at least 1, at most max_predictions_per_seq),
taken unit by unit in random order, so the realized rate is the configured one whatever the units' lengths. The
loaders' `Collator` hashes (instance key, unit, stream), so masks never depend on which batch, rank or worker builds
an instance."""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertrain.batch_layout import IGNORE_INDEX, batch_layout
from bertrain.data.sentences import TERMINAL_MARKS
from bertrain.errors import DataError
from bertrain.special_tokens import SPECIAL_IDS, WORD_MARKERS
from bertrain.tokenizer_file import load_tokenizer

FIRST_REGULAR_ID = max(SPECIAL_IDS.values()) + 1   # the special tokens come first in both tokenizer kinds

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STREAM = np.uint64(0xD1B54A32D192ED03)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 2.0 ** -53
_SHIFTS = tuple(np.uint64(n) for n in (30, 27, 31, 11))
_NEVER = np.uint64(2 ** 64 - 1)   # the order key of tokens that are never chosen (keyed bits have 53 bits)
FILL_PASSES = 3                   # passes that fill what a unit too long for the rest of the budget left over

STREAM_CHOOSE, STREAM_ACTION, STREAM_RANDOM_ID, STREAM_PRIORITY, STREAM_SPAN = range(5)


def mask_tokens(input_ids, special_tokens_mask, vocab_size: int, mask_token_id: int, generator,
                mlm_probability: float = 0.15, mask_prob: float = 0.8, random_prob: float = 0.1, *,
                pad_token_id: int = SPECIAL_IDS["pad"], first_regular_id: int = FIRST_REGULAR_ID):
    """BERT masking of a [B, T] batch: (masked input_ids, labels: IGNORE_INDEX where not chosen). Of the chosen
    positions `mask_prob` become [MASK], `random_prob` a random non-special id, the rest stay."""
    import torch  # seconds to import: only this torch-driven variant needs it, not the numpy masking

    eligible = ~special_tokens_mask.bool() & (input_ids != pad_token_id)
    probability = torch.full(input_ids.shape, mlm_probability, dtype=torch.float32)
    chosen = torch.bernoulli(probability, generator=generator).bool() & eligible
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator)
    random_ids = torch.randint(first_regular_id, vocab_size, input_ids.shape, generator=generator,
                               dtype=input_ids.dtype)
    masked = torch.where(chosen & (action < mask_prob), torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(chosen & (action >= mask_prob) & (action < mask_prob + random_prob), random_ids, masked)
    return masked, labels


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of a fresh uint64 array, in place (a batch's [B, T] arrays: no temporaries to allocate)."""
    x += _GOLDEN
    x ^= x >> _SHIFTS[0]
    x *= _MIX1
    x ^= x >> _SHIFTS[1]
    x *= _MIX2
    x ^= x >> _SHIFTS[2]
    return x


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function of state x + golden: a bijective uint64 mixer (vectorized)."""
    with np.errstate(over="ignore"):
        return _mix(x.astype(np.uint64))


@functools.lru_cache(maxsize=64)
def _key_head(seed: int, stream: int, epoch: int) -> np.ndarray:
    """[1] uint64 hash of (seed, stream, epoch): the same for every instance of an epoch, so made once."""
    head = np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    for part in (stream, epoch):
        head = splitmix64(head ^ np.uint64(part & 0xFFFFFFFFFFFFFFFF))
    head.flags.writeable = False   # shared by every call with these arguments
    return head


def instance_keys(seed: int, stream: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    """[B] uint64 key of each instance: a hash of (seed, stream (split), epoch, position in the epoch)."""
    return splitmix64(_key_head(seed, stream, epoch) ^ np.asarray(positions).astype(np.uint64))


def keyed_bits(keys: np.ndarray, units: np.ndarray, stream: int) -> np.ndarray:
    """53 random bits per (key, unit, stream): SplitMix64 output `unit` of a generator seeded with the key."""
    with np.errstate(over="ignore"):
        counter = units.astype(np.uint64) * _GOLDEN + np.uint64(stream) * _STREAM
        bits = _mix(np.bitwise_xor(keys, counter, dtype=np.uint64))
        bits >>= _SHIFTS[3]
        return bits


def threshold(probability: float) -> np.uint64:
    """keyed_bits(...) < threshold(p) holds with probability p."""
    return np.uint64(round(min(max(probability, 0.0), 1.0) * 2.0 ** 53))


def keyed_uniform(keys: np.ndarray, units: np.ndarray, stream: int) -> np.ndarray:
    """Uniform [0, 1) float64 per (key, unit, stream) (keys broadcast against units)."""
    return keyed_bits(keys, units, stream).astype(np.float64) * _TO_UNIT


SENTENCE_FINAL = tuple(TERMINAL_MARKS)  # of every script the sentence rules know, not only . ! ?


def sentence_final_table(tokenizer_file: str, vocab_size: int) -> np.ndarray:
    """[vocab] bool: does this token end on a sentence mark (. ! ? 。 । ...)? NSP negatives match it; the pair
    audit probes it."""
    tokenizer = load_tokenizer(tokenizer_file)
    size = max(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
    return np.array([(tokenizer.id_to_token(token_id) or "").endswith(SENTENCE_FINAL) for token_id in range(size)])


def word_start_table(tokenizer_file: str, kind: str, word_marker: str | None, vocab_size: int) -> np.ndarray:
    """[vocab] bool: does this token start a word? From the tokenizer's vocab and its word marker; a piece of
    Unigram punctuation only starts one too (see is_punctuation)."""
    return word_tables(tokenizer_file, kind, word_marker, vocab_size)[0]


def is_punctuation(token: str, marker: str) -> bool:
    """A Unigram piece of punctuation and symbols only ("(", ",", "▁$"), which bertrain's Unigram pre-tokenizer
    splits off without a "▁": a word of its own, as ALBERT's create_pretraining_data counts it."""
    text = token.removeprefix(marker)
    return bool(text) and all(unicodedata.category(char)[0] in "PS" for char in text)


def word_tables(tokenizer_file: str, kind: str, word_marker: str | None, vocab_size: int) -> tuple[np.ndarray, ...]:
    """([vocab] bool word starts, pieces of punctuation only, the bare word marker "▁") of the tokenizer's vocab."""
    expected = WORD_MARKERS.get(kind)
    if expected is None:
        raise DataError(f"Whole-word and n-gram masking need the tokenizer kind, and the manifest says {kind!r} "
                        f"(known: wordpiece, unigram). Use data.masking: token, or prepare the data again.")
    if word_marker is not None and word_marker != expected:
        raise DataError(f"The manifest's tokenizer.word_marker is {word_marker!r}, but a {kind} tokenizer marks "
                        f"words with {expected!r}. Prepare the data again, or use data.masking: token.")
    try:
        tokenizer = load_tokenizer(tokenizer_file)
    except DataError as error:
        raise DataError(f"{error} Whole-word and n-gram masking need it: prepare the data again, or use "
                        f"data.masking: token.") from None
    # By id, not via get_vocab(): a vocab may hold the same string twice, and every id needs an entry.
    size = max(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
    table, punctuation, bare = np.ones(size, dtype=bool), np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)
    for token_id in range(size):
        token = tokenizer.id_to_token(token_id)
        if token is not None:
            # WordPiece marks pieces that continue a word, Unigram pieces that start one.
            is_continuation = token.startswith(expected) if kind == "wordpiece" else not token.startswith(expected)
            # WordPiece's pre-tokenizer already makes punctuation a word; symbols it leaves in words ("p##→##q").
            punctuation[token_id] = kind == "unigram" and is_punctuation(token, expected)
            table[token_id] = not is_continuation or punctuation[token_id]
            bare[token_id] = kind == "unigram" and token == expected
    table[:FIRST_REGULAR_ID], punctuation[:FIRST_REGULAR_ID] = True, False
    return table, punctuation, bare


@dataclass
class MaskingSettings:
    """The masking keys of DataConfig, resolved against the prepared data."""

    vocab_size: int
    mask_token_id: int
    masking: str = "token"
    mlm_probability: float = 0.15
    mask_prob: float = 0.8
    random_prob: float = 0.1
    ngram_max: int = 3
    max_predictions_per_seq: int | None = None
    word_start: np.ndarray | None = None   # [vocab] bool, needed by whole_word and ngram

    def __post_init__(self) -> None:
        if self.masking not in ("token", "whole_word", "ngram"):
            raise DataError(f"data.masking must be token, whole_word or ngram, not {self.masking!r}.")
        if self.masking != "token" and self.word_start is None:
            raise DataError(f"data.masking: {self.masking} needs the tokenizer's word starts.")
        weights = 1.0 / np.arange(1, self.ngram_max + 1)
        self.span_cdf = weights.cumsum() / weights.sum()


def predictions_per_row(settings: MaskingSettings, eligible: np.ndarray) -> np.ndarray:
    """[B] tokens to predict in each row: round(mlm_probability x eligible tokens), at least 1 (when the
    probability is not 0), at most max_predictions_per_seq, as Google's num_to_predict."""
    count = eligible.sum(axis=1)
    target = np.rint(settings.mlm_probability * count).astype(np.int64)
    if settings.mlm_probability > 0:
        target = np.maximum(target, 1)
    if settings.max_predictions_per_seq is not None:
        target = np.minimum(target, settings.max_predictions_per_seq)
    return np.minimum(target, count)


def _take_in_order(order: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """[B, T] bool: per row, the tokens whose order key is below the budget-th smallest one, i.e. whole units
    (tokens sharing a key) in key order up to the first that does not fit; _NEVER keys are never taken."""
    ranked = np.sort(order, axis=1)
    column = np.minimum(budget, order.shape[1] - 1)[:, None]
    limit = np.where(budget[:, None] < order.shape[1], np.take_along_axis(ranked, column, axis=1), _NEVER)
    return order < limit


def _unit_lengths(units: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """[B, T] number of eligible tokens in each token's unit."""
    flat = np.arange(units.shape[0])[:, None] * units.shape[1] + units
    counts = np.bincount(flat[eligible], minlength=units.size)
    return counts[flat]


def _span_order(settings: MaskingSettings, keys: np.ndarray, units: np.ndarray) -> np.ndarray:
    """[B, T] order key of each token under n-gram masking: the smallest key of the spans covering its word.
    A span starts at every word (indices -n_max+1 .. T-1, shifted by n_max to be >= 0, so the first words are
    covered as often as the others), is n words long with probability ∝ 1/n and has a random key."""
    n_max = settings.ngram_max
    starts = np.arange(units.shape[1] + n_max)[None, :]                         # [1, T + n_max]
    start_key = keyed_bits(keys[:, None], starts, STREAM_CHOOSE)
    span_bits = keyed_bits(keys[:, None], starts, STREAM_SPAN)
    span = 1 + sum((span_bits >= threshold(c)).astype(np.int64) for c in settings.span_cdf[:-1])
    order = np.full(units.shape, _NEVER)
    for k in range(n_max):                                                       # a span from word w-k covers w
        start = units + (n_max - k)
        reaches = np.take_along_axis(span, start, axis=1) > k
        order = np.minimum(order, np.where(reaches, np.take_along_axis(start_key, start, axis=1), _NEVER))
    return order


def _choose(settings: MaskingSettings, keys: np.ndarray, units: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """[B, T] bool: tokens chosen for prediction, predictions_per_row of them in whole units (spans of words
    for ngram) taken in random order; units too long for what is left are skipped and the rest filled."""
    budget = predictions_per_row(settings, eligible)
    chosen = np.zeros(eligible.shape, dtype=bool)
    if settings.masking == "ngram":
        chosen = _take_in_order(np.where(eligible, _span_order(settings, keys, units), _NEVER), budget)
    unit_order = keyed_bits(keys[:, None], units, STREAM_PRIORITY)
    # A token is a unit of length 1: it fits in any row with room left.
    length = None if settings.masking == "token" else _unit_lengths(units, eligible)
    for _ in range(FILL_PASSES):
        taken = chosen.sum(axis=1)
        rows = np.flatnonzero(taken < budget)      # only rows with room left
        if not len(rows):
            break
        if len(rows) == len(budget):   # every row (the first pass, mostly): views, not copies of [B, T] arrays
            rows = slice(None)
        left = budget[rows] - taken[rows]
        fits = eligible[rows] & ~chosen[rows]
        if length is not None:
            fits &= length[rows] <= left[:, None]
        chosen[rows] |= _take_in_order(np.where(fits, unit_order[rows], _NEVER), left)
    return chosen


def mask_batch(settings: MaskingSettings, input_ids: np.ndarray, special: np.ndarray, keys: np.ndarray,
               word_start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Keyed masking of a [B, T] batch -> (masked ids, labels); `special` marks [CLS], [SEP], padding;
    `word_start` [B, T] the tokens that start words as prepare stored them (None: the tokenizer's marks)."""
    eligible = ~special
    if settings.masking == "token":
        units = np.arange(input_ids.shape[1])[None, :]       # [1, T]: each token its own unit, in every row
    else:
        # A word starts at a marked token, at a special token, and right after one (segment starts).
        after_special = np.zeros_like(special)
        after_special[:, 1:] = special[:, :-1]
        marked = settings.word_start[input_ids] if word_start is None else word_start
        starts = marked | special | after_special
        units = np.cumsum(starts, axis=1) - 1                # [B, T] word index within the row
    chosen = _choose(settings, keys, units, eligible)
    # The 80/10/10 draws are made only where needed: per chosen unit, then per randomized token. Chosen
    # tokens by flat index b * T + t, row-major (np.nonzero's order; flatnonzero is ~4x faster on [B, T]).
    flat = np.flatnonzero(chosen)
    rows, columns = np.divmod(flat, chosen.shape[1])
    action = keyed_bits(keys[rows], columns if settings.masking == "token" else units[rows, columns], STREAM_ACTION)
    to_mask = action < threshold(settings.mask_prob)
    to_random = ~to_mask & (action < threshold(settings.mask_prob + settings.random_prob))
    span = settings.vocab_size - FIRST_REGULAR_ID
    random_ids = FIRST_REGULAR_ID + (keyed_uniform(keys[rows[to_random]], columns[to_random], STREAM_RANDOM_ID)
                                     * span).astype(np.int64)
    masked = input_ids.copy()
    masked.reshape(-1)[flat[to_mask]] = settings.mask_token_id
    masked.reshape(-1)[flat[to_random]] = random_ids
    labels = np.full(input_ids.shape, IGNORE_INDEX, dtype=np.int64)
    labels.reshape(-1)[flat] = input_ids.reshape(-1)[flat]
    return masked, labels


@dataclass
class AssembledBatch:
    """Instances laid out as a padded [B, T] matrix, before masking."""

    input_ids: np.ndarray        # [B, T] int64 with [CLS]/[SEP]/[PAD]
    token_type_ids: np.ndarray   # [B, T] int64
    attention_mask: np.ndarray   # [B, T] bool
    special: np.ndarray          # [B, T] bool: [CLS], [SEP], padding
    sentence_label: np.ndarray | None   # [B]
    keys: np.ndarray             # [B] uint64 instance keys
    word_start: np.ndarray | None = None   # [B, T] bool: tokens that start a word (None: from the tokenizer)


class Collator:
    """Masks an assembled batch and returns the training dict of int64 tensors, with its BatchLayout under
    "layout" (computed here on the host, so the step never reads the masks back from the device)."""

    def __init__(self, settings: MaskingSettings):
        self.settings = settings

    def __call__(self, batch: AssembledBatch) -> dict[str, Any]:
        import torch  # seconds to import: only the tensors handed to training need it

        masked, labels = mask_batch(self.settings, batch.input_ids, batch.special, batch.keys, batch.word_start)
        out = {"input_ids": torch.from_numpy(masked.astype(np.int64, copy=False)),
               "attention_mask": torch.from_numpy(batch.attention_mask.astype(np.int64)),
               "token_type_ids": torch.from_numpy(batch.token_type_ids.astype(np.int64, copy=False)),
               "labels": torch.from_numpy(labels.astype(np.int64, copy=False))}
        if batch.sentence_label is not None:
            out["sentence_label"] = torch.from_numpy(batch.sentence_label.astype(np.int64))
        out["layout"] = batch_layout(batch.attention_mask, labels, batch.sentence_label)
        return out
