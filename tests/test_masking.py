"""Dynamic masking: mask_tokens (torch.Generator) and the loaders' keyed collator, in all three modes.

Tolerances are 5 standard deviations of the count, computed from the binomial (or, for words and
spans, from the per-word variance) in each test.
"""

from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest
import torch

from bertrain.batch_layout import IGNORE_INDEX
from bertrain.config import DataConfig
from bertrain.data.format import open_prepared, write_manifest
from bertrain.data.loader import MicroBatchDataset, epoch_plan, masking_settings
from bertrain.data.masking import Collator, mask_tokens
from bertrain.errors import DataError
from bertrain.tokenizer_file import load_tokenizer
from tests.helpers import make_prepared_dir

MASK, FIRST_REGULAR = 4, 5


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("masking")
    return {kind: make_prepared_dir(root / kind, kind=kind, num_documents=150, seed=1)
            for kind in ("wordpiece", "unigram")}


def within(count: float, expected: float, variance: float, sigmas: float = 5.0) -> bool:
    return abs(count - expected) <= sigmas * np.sqrt(variance)


def check_split(chosen_count: int, masked: int, randomized: int, mask_prob=0.8, random_prob=0.1, vocab=None):
    """80/10/10 among chosen units (a random replacement equal to the original counts as unchanged)."""
    assert chosen_count > 1000
    p_random = random_prob * (1 - 1 / (vocab - FIRST_REGULAR)) if vocab else random_prob
    assert within(masked, mask_prob * chosen_count, chosen_count * mask_prob * (1 - mask_prob))
    assert within(randomized, p_random * chosen_count, chosen_count * p_random * (1 - p_random))


def test_mask_tokens_statistics_and_invariants():
    generator = torch.Generator().manual_seed(0)
    vocab = 30000
    input_ids = torch.randint(FIRST_REGULAR, vocab, (1200, 128), generator=generator)
    special = torch.rand(input_ids.shape, generator=generator) < 0.1
    input_ids[special] = torch.randint(1, 4, (int(special.sum()),), generator=generator)
    input_ids[:, 110:] = 0                                     # padding, not marked special on purpose
    special[:, 110:] = False
    eligible = ~special & (input_ids != 0)
    masked, labels = mask_tokens(input_ids, special, vocab, MASK, generator)
    chosen = labels != IGNORE_INDEX
    n = int(eligible.sum())
    assert n >= 100_000
    assert not (chosen & ~eligible).any()                      # special tokens and padding never chosen
    assert within(int(chosen.sum()), 0.15 * n, n * 0.15 * 0.85)
    assert torch.equal(labels[chosen], input_ids[chosen])      # labels hold the original ids exactly there
    assert torch.equal(masked[~chosen], input_ids[~chosen])
    is_mask = chosen & (masked == MASK)
    randomized = chosen & (masked != MASK) & (masked != input_ids)
    assert (masked[randomized] >= FIRST_REGULAR).all()         # random replacements are never special
    check_split(int(chosen.sum()), int(is_mask.sum()), int(randomized.sum()), vocab=vocab)
    # Same generator state, same result; another seed, another result.
    again = mask_tokens(input_ids, special, vocab, MASK, torch.Generator().manual_seed(0))
    first = mask_tokens(input_ids, special, vocab, MASK, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], first[0])
    other = mask_tokens(input_ids, special, vocab, MASK, torch.Generator().manual_seed(1))
    assert not torch.equal(other[1], first[1])


def collect(data_dir, config: DataConfig, batches: int, batch_size: int = 128, epoch: int = 0, seed: int = 11):
    """(original ids, special, masked ids, labels) stacked over `batches` micro-batches (rows padded)."""
    prepared = open_prepared(data_dir)
    plan = epoch_plan(prepared, config, seed=seed, epoch=epoch)
    dataset = MicroBatchDataset(prepared, config, plan, masking_settings(prepared, config), split="train",
                                seed=seed, epoch=epoch, micro_batch_size=batch_size, rank=0, world_size=1)
    collator = Collator(dataset.collator.settings)
    rows = []
    for m in range(min(batches, len(dataset))):
        assembled = dataset.assemble(dataset.positions(m))
        out = collator(assembled)
        assert torch.equal(out["input_ids"], dataset[m]["input_ids"])
        width = config.max_seq_length
        pad = lambda x, v: np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=v)  # noqa: E731
        rows.append((pad(assembled.input_ids, 0), pad(assembled.special, True),
                     pad(out["input_ids"].numpy(), 0), pad(out["labels"].numpy(), IGNORE_INDEX)))
    return [np.concatenate(parts) for parts in zip(*rows)]


def words_of(ids: np.ndarray, special: np.ndarray, kind: str, data_dir) -> np.ndarray:
    """[B, T] word index per token, found independently from the token strings of DATA_DIR's tokenizer."""
    tokenizer = load_tokenizer(data_dir / "tokenizer")
    strings = {i: tokenizer.id_to_token(i) for i in np.unique(ids).tolist()}
    if kind == "wordpiece":
        starts_word = np.vectorize(lambda t: not strings[t].startswith("##"))(ids)
    else:  # "▁" starts a word; so does punctuation (ALBERT's rule) and the piece after it (WordPiece's split)
        punctuation = np.vectorize(lambda t: strings[t].strip("▁") != "" and all(
            unicodedata.category(c).startswith(("P", "S")) for c in strings[t].strip("▁")))(ids)
        starts_word = np.vectorize(lambda t: strings[t].startswith("▁"))(ids) | punctuation
        starts_word[:, 1:] |= punctuation[:, :-1]
        starts_word[:, 1:] &= np.vectorize(lambda t: strings[t] != "▁")(ids[:, :-1])   # "▁" "$": one word
    previous_special = np.ones_like(special)
    previous_special[:, 1:] = special[:, :-1]
    starts = starts_word | special | previous_special
    return np.cumsum(starts, axis=1) - 1


def test_token_masking_in_the_collator(data_dirs):
    config = DataConfig(objective="nsp", max_seq_length=128, masking="token")
    ids, special, masked, labels = collect(data_dirs["wordpiece"], config, batches=12)
    vocab = open_prepared(data_dirs["wordpiece"]).vocab_size
    chosen = labels != IGNORE_INDEX
    n = int((~special).sum())
    assert n >= 100_000
    assert not (chosen & special).any()
    assert np.array_equal(labels[chosen], ids[chosen]) and np.array_equal(masked[~chosen], ids[~chosen])
    assert within(int(chosen.sum()), 0.15 * n, n * 0.15 * 0.85)
    randomized = chosen & (masked != MASK) & (masked != ids)
    assert (masked[randomized] >= FIRST_REGULAR).all() and (masked[randomized] < vocab).all()
    check_split(int(chosen.sum()), int((chosen & (masked == MASK)).sum()), int(randomized.sum()), vocab=vocab)


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
@pytest.mark.parametrize("mode", ["whole_word", "ngram"])
def test_word_masking_never_splits_a_word(data_dirs, kind, mode):
    config = DataConfig(objective="sop", max_seq_length=128, masking=mode)
    ids, special, masked, labels = collect(data_dirs[kind], config, batches=8)
    chosen = labels != IGNORE_INDEX
    assert not (chosen & special).any()
    assert np.array_equal(labels[chosen], ids[chosen])
    words = words_of(ids, special, kind, data_dirs[kind])
    flat = (np.arange(len(ids))[:, None] * ids.shape[1] + words).ravel()
    eligible = (~special).ravel()
    _, word, word_length = np.unique(flat[eligible], return_inverse=True, return_counts=True)
    tokens_chosen = np.bincount(word, weights=chosen.ravel()[eligible])
    tokens_masked = np.bincount(word, weights=(chosen & (masked == MASK)).ravel()[eligible])
    # Whole words: a word is chosen entirely or not at all, and [MASK]ed entirely or not at all.
    assert np.all((tokens_chosen == 0) | (tokens_chosen == word_length))
    assert np.all((tokens_masked == 0) | (tokens_masked == word_length))
    word_chosen = tokens_chosen > 0
    assert (word_chosen & (word_length > 1)).sum() > 200          # multi-piece words were in play
    # The masked share of eligible tokens is 15%; words (and spans) make the count's variance larger.
    n = int(eligible.sum())
    assert n >= 80_000
    p = 0.15
    if mode == "whole_word":
        variance = p * (1 - p) * float((word_length.astype(float) ** 2).sum())
    else:  # coverage of words closer than ngram_max is correlated: bound each covariance by p(1-p)
        length = word_length.astype(float)
        neighbours = sum(np.roll(length, k) for k in range(-2, 3))
        variance = p * (1 - p) * float((length * neighbours).sum())
    assert within(int(chosen.sum()), p * n, variance)
    # 80/10/10 decided per word.
    chosen_words = int(word_chosen.sum())
    masked_words = int((tokens_masked > 0).sum())
    assert within(masked_words, 0.8 * chosen_words, chosen_words * 0.8 * 0.2)
    if mode == "ngram":  # spans: a chosen word's successor is chosen far more often than 15%
        follow = word_chosen[:-1] & word_chosen[1:]
        assert follow.sum() / word_chosen[:-1].sum() > 0.35


def test_max_predictions_per_seq_caps_whole_words(data_dirs):
    config = DataConfig(objective="sop", max_seq_length=128, masking="whole_word", max_predictions_per_seq=6)
    ids, special, masked, labels = collect(data_dirs["wordpiece"], config, batches=2)
    chosen = labels != IGNORE_INDEX
    assert chosen.sum(axis=1).max() <= 6
    assert (chosen.sum(axis=1) >= 3).mean() > 0.9                   # capped, not emptied
    words = words_of(ids, special, "wordpiece", data_dirs["wordpiece"])
    for row in range(len(ids)):
        for w in np.unique(words[row][chosen[row]]):
            in_word = (words[row] == w) & ~special[row]
            assert chosen[row][in_word].all()


def test_keyed_masks_depend_on_epoch_not_on_batch_layout(data_dirs):
    config = DataConfig(objective="nsp", max_seq_length=64, masking="whole_word")
    one = collect(data_dirs["unigram"], config, batches=1, batch_size=16)
    halves = collect(data_dirs["unigram"], config, batches=2, batch_size=8)
    for a, b in zip(one, halves):
        assert np.array_equal(a, b)
    other_epoch = collect(data_dirs["unigram"], config, batches=1, batch_size=16, epoch=1)
    assert not np.array_equal(one[3], other_epoch[3])


def rewrite_manifest(data_dir, **tokenizer_changes):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    manifest["tokenizer"].update(tokenizer_changes)
    write_manifest(data_dir, manifest)


def test_word_masking_with_an_unknown_tokenizer_kind_is_a_clear_error(tmp_path):
    data_dir = make_prepared_dir(tmp_path / "bpe", num_documents=20, validation_documents=2, max_paragraphs=200)
    rewrite_manifest(data_dir, kind="bpe", word_marker="Ġ")
    prepared = open_prepared(data_dir)
    with pytest.raises(DataError, match="'bpe'"):
        masking_settings(prepared, DataConfig(masking="whole_word"))
    assert masking_settings(prepared, DataConfig(masking="token")).word_start is None
    rewrite_manifest(data_dir, kind="wordpiece", word_marker="▁")
    with pytest.raises(DataError, match="word_marker"):
        masking_settings(open_prepared(data_dir), DataConfig(masking="ngram"))


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
@pytest.mark.parametrize("mode", ["token", "whole_word", "ngram"])
@pytest.mark.parametrize("cap", [None, 20])
def test_each_sequence_predicts_round_15_percent_of_its_tokens(data_dirs, kind, mode, cap):
    # Google's num_to_predict = min(max_predictions_per_seq, max(1, round(0.15 x tokens))) per sequence: exact for
    # tokens; whole units may leave less than one unit's length short (the fill passes take what still fits).
    config = DataConfig(objective="sop", max_seq_length=128, masking=mode, max_predictions_per_seq=cap)
    ids, special, masked, labels = collect(data_dirs[kind], config, batches=4)
    chosen = labels != IGNORE_INDEX
    eligible = (~special).sum(axis=1)
    target = np.maximum(1, np.rint(0.15 * eligible)).astype(int)
    target = np.minimum(target, cap) if cap else target
    count = chosen.sum(axis=1)
    assert (count <= target).all()
    if mode == "token":
        assert np.array_equal(count, target)
    else:
        words = words_of(ids, special, kind, data_dirs[kind])
        longest = np.array([np.bincount(w[~s]).max() for w, s in zip(words, special)])
        assert (count > target - longest).all()
    # The realized rate is the configured 15% within half a point (the rounding of short rows aside).
    assert abs(count.sum() / target.sum() - 1) < 0.01 and abs(target.sum() / eligible.sum() - 0.15) < 0.005
