"""Epoch plans (NSP / SOP / none): Google's pair rules, realized statistics, assembly from the shards."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bertrain.config import DataConfig
from bertrain.data.format import open_prepared
from bertrain.data.loader import MicroBatchDataset, epoch_plan, masking_settings, nsp_split_index, split_index
from bertrain.data import pair_chunks
from bertrain.data.pair_chunks import random_b
from bertrain.data.pairs import build_plan
from bertrain.data.split_index import gather_tokens, read_bits, read_spans, read_values
from bertrain.tokenizer_file import load_tokenizer
from bertrain.errors import DataError
from tests.helpers import make_prepared_dir


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return open_prepared(make_prepared_dir(tmp_path_factory.mktemp("pairs") / "data", kind="wordpiece",
                                           num_documents=200, seed=0))


def sigma_bound(p: float, n: int, sigmas: float = 5.0) -> float:
    """Tolerance for a binomial proportion: `sigmas` standard deviations."""
    return sigmas * np.sqrt(p * (1 - p) / n)


def plans(prepared, objective: str, epochs: range, **settings) -> list:
    index = split_index(prepared, "train")
    defaults = {"max_seq_length": 64, "short_seq_prob": 0.1}
    return [build_plan(index, objective=objective, seed=7, epoch=e, **{**defaults, **settings}) for e in epochs]


def document_end_token(index, document: np.ndarray) -> np.ndarray:
    last = index.document_first[document + 1] - 1
    return index.sentence_start[last] + index.sentence_cum[last + 1] - index.sentence_cum[last]


def test_instances_are_assembled_from_the_plan_spans(prepared):
    config = DataConfig(objective="nsp", max_seq_length=64, masking="token")
    plan = epoch_plan(prepared, config, seed=3, epoch=0)
    dataset = MicroBatchDataset(prepared, config, plan, masking_settings(prepared, config), split="train", seed=3,
                                epoch=0, micro_batch_size=64, rank=0, world_size=1)
    # An independent read of the tokens: concatenate the shards (the global token space).
    tokens = np.concatenate([np.asarray(s.tokens, dtype=np.int64) for s in prepared.split("train").shards])
    positions = np.arange(64, 128)
    batch = dataset.assemble(positions)
    assert batch.input_ids.shape[1] % 8 == 0
    for row, instance in enumerate(plan.order[positions]):
        a = tokens[plan.a_start[instance]:plan.a_start[instance] + plan.a_length[instance]]
        b = tokens[plan.b_start[instance]:plan.b_start[instance] + plan.b_length[instance]]
        expected = np.concatenate([[2], a, [3], b, [3]])
        width = len(expected)
        assert width <= 64
        assert batch.input_ids[row, :width].tolist() == expected.tolist()
        assert (batch.input_ids[row, width:] == 0).all()
        assert batch.token_type_ids[row].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (
            batch.input_ids.shape[1] - width)
        assert batch.attention_mask[row].sum() == width
        assert batch.sentence_label[row] == plan.sentence_label[instance]


@pytest.mark.parametrize("bits", [False, True])
def test_read_spans_writes_what_gather_tokens_reads(bits):
    """Span by span (the loader's read) equals token by token: shards of any size, empty spans, spans across
    shards (the fallback), packed bits."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        sizes = rng.integers(0, 40, int(rng.integers(1, 5)))
        shards = [(np.packbits(rng.random(n) < 0.5) if bits else rng.integers(0, 60000, n).astype(np.uint16))
                  for n in sizes]
        base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        starts = rng.integers(0, base[-1] + 1, 8)
        lengths = np.minimum(rng.integers(0, 12, 8), base[-1] - starts)
        at = np.cumsum(lengths + rng.integers(0, 3, 8)) - lengths
        read = read_bits if bits else read_values
        out = np.full(int(at[-1] + lengths[-1]) + 2, -1, dtype=np.int64)
        doubled = np.full_like(out, -1)             # a second target: the same spans of the values times 2
        twice = lambda array, local: 2 * read(array, local).astype(np.int64)  # noqa: E731
        written = read_spans(base, starts, lengths, at, [(shards, out, read), (shards, doubled, twice)])
        expected = np.full_like(out, -1)
        for start, length, place in zip(starts, lengths, at):
            expected[place:place + length] = gather_tokens(shards, base, np.arange(start, start + length), read)
        assert out.tolist() == expected.tolist()
        assert doubled.tolist() == np.where(expected >= 0, 2 * expected, -1).tolist()
        assert sorted(written.tolist()) == np.concatenate([np.arange(p, p + n) for p, n in zip(at, lengths)]).tolist()


def test_nsp_half_negatives_always_from_another_document(prepared):
    epoch_plans = plans(prepared, "nsp", range(5))
    label = np.concatenate([p.sentence_label for p in epoch_plans])
    label = label[label != -100]           # a piece of a sentence longer than an instance: MLM only
    assert len(label) >= 10_000
    assert abs((label == 0).mean() - 0.5) < sigma_bound(0.5, len(label))
    for plan in epoch_plans:
        negative = plan.sentence_label == 1
        assert (plan.b_document[negative] != plan.document[negative]).all()
        # Positives: B follows A inside the same document (truncation may cut A's end only).
        positive = plan.sentence_label == 0
        assert (plan.b_document[positive] == plan.document[positive]).all()
        assert (plan.b_start[positive] >= plan.a_start[positive] + plan.a_length[positive]).all()
        assert (plan.a_length >= 1).all() and (plan.b_length >= 1).all()
        assert (plan.a_length + plan.b_length <= 64 - 3).all()


def test_nsp_random_b_ends_on_a_full_stop_where_the_positive_did(prepared):
    index = nsp_split_index(prepared, "train")
    tokenizer = load_tokenizer(prepared.tokenizer_dir)   # an independent reading of the last tokens
    last = gather_tokens([shard.tokens for shard in prepared.split("train").shards], index.token_base,
                         index.sentence_cum[1:] - 1)
    ends = np.array([tokenizer.id_to_token(int(t)).endswith((".", "!", "?")) for t in last])
    assert (index.sentence_final == ends).all() and 0.2 < ends.mean() < 0.9
    rng = np.random.default_rng(0)
    count = 2000
    document = rng.integers(0, index.num_documents, count)
    wanted = rng.random(count) < 0.5
    room = np.full(count, 60)
    first, end, other = random_b(index, np.arange(index.num_documents), rng, document, np.full(count, 30),
                                 np.zeros(count, np.int64), room, 61, wanted)
    assert (other != document).all() and (end >= first).all()
    assert (ends[end] == wanted).mean() > 0.99
    first, end, _ = random_b(index, np.arange(index.num_documents), rng, document, np.full(count, 30),
                             np.zeros(count, np.int64), room, 61)
    assert 0.35 < (ends[end] == wanted).mean() < 0.65   # without b_final: independent of it


def off_sentence_bounds(index, plan, max_tokens: int) -> np.ndarray:
    """Labelled instances with a segment starting or ending inside a sentence that was not a truncated pair
    (two whole sentences cut to exactly max_tokens)."""
    cum = index.sentence_cum
    a0, al = plan.a_start, plan.a_length.astype(np.int64)
    b0, bl = plan.b_start, plan.b_length.astype(np.int64)
    sentence = lambda token: np.searchsorted(cum, token, side="right") - 1  # noqa: E731
    a1, a2, b1, b2 = sentence(a0), sentence(a0 + al - 1), sentence(b0), sentence(b0 + bl - 1)
    whole = (a0 == cum[a1]) & (a0 + al == cum[a2 + 1]) & (b0 == cum[b1]) & (b0 + bl == cum[b2 + 1])
    truncated = (al + bl == max_tokens) & (a1 == a2) & (b1 == b2)
    return (plan.sentence_label != -100) & ~whole & ~truncated


def test_an_instance_with_no_negative_b_by_the_rules_is_left_unlabelled_whatever_its_label(prepared, monkeypatch):
    # After RANDOM_B_DRAWS draws "any other document" gave B, cut to fit: mid-sentence, the cue the rules remove
    # (55 of 96,174 labelled instances on a docstring corpus). Unlabelling only such negatives left their kind of A
    # with positives only; the same search runs for positives. With one draw most instances meet that case.
    index = split_index(prepared, "train")
    normal = plans(prepared, "nsp", range(2))
    monkeypatch.setattr(pair_chunks, "RANDOM_B_DRAWS", 1)
    starved = plans(prepared, "nsp", range(2))
    for plan in normal + starved:
        assert not off_sentence_bounds(index, plan, 64 - 3).any()
    unlabelled = [sum(int((p.sentence_label == -100).sum()) for p in group) for group in (normal, starved)]
    assert unlabelled[1] > unlabelled[0] + 1000   # MLM only, their tokens still trained
    assert [len(p) for p in starved] == [len(p) for p in normal]
    label = np.concatenate([p.sentence_label for p in starved])
    label = label[label != -100]
    assert abs((label == 1).mean() - 0.5) < sigma_bound(0.5, len(label))   # the labels left are still half and half


def test_sop_negatives_are_exact_swaps_of_positives(prepared):
    epoch_plans = plans(prepared, "sop", range(6))
    label = np.concatenate([p.sentence_label for p in epoch_plans])
    label = label[label != -100]
    assert len(label) >= 10_000
    assert abs((label == 0).mean() - 0.5) < sigma_bound(0.5, len(label))
    untruncated_negatives = 0
    for plan in epoch_plans:
        assert (plan.b_document == plan.document).all()            # never a random-document B
        negative = plan.sentence_label == 1
        first_start = np.where(negative, plan.b_start, plan.a_start)  # the segment that comes first in the text
        first_end = np.where(negative, plan.b_start + plan.b_length, plan.a_start + plan.a_length)
        second_start = np.where(negative, plan.a_start, plan.b_start)
        assert (first_end <= second_start).all()
        # When nothing was truncated the two segments are adjacent: the negative is the positive swapped.
        whole = plan.a_length + plan.b_length < 64 - 3
        assert (first_end[whole] == second_start[whole]).all()
        assert first_start[whole].min() >= 0
        untruncated_negatives += int((whole & negative).sum())
    assert untruncated_negatives > 100


def test_segments_start_and_end_at_sentence_boundaries_unless_truncated(prepared):
    # With short targets (all drawn below the limit) many sentences fill a chunk alone: such a chunk
    # takes a neighbouring sentence instead of being cut inside (that gave "B starts mid-word" =
    # positive). Instances that needed no truncation show it: every segment is whole sentences.
    index = split_index(prepared, "train")
    starts = set(index.sentence_start.tolist()) | {int(index.sentence_cum[-1])}
    for objective in ("sop", "nsp"):
        plan = build_plan(index, objective=objective, max_seq_length=64, short_seq_prob=1.0, seed=1, epoch=0)
        labelled = plan.sentence_label != -100
        # Every document here has several sentences: an instance without a label lies inside one sentence
        # (a piece of a sentence longer than an instance, or NSP's last sentence of a document, put back), or
        # (NSP, rare) is a pair no negative's B by the rules was found for.
        inside = np.searchsorted(index.sentence_cum, np.stack([plan.a_start, plan.b_start + plan.b_length - 1]),
                                 side="right")
        pairs = ~labelled & (inside[0] != inside[1])
        assert (objective == "nsp" or not pairs.any()) and pairs.sum() <= 0.01 * len(plan), pairs.sum()
        assert labelled.mean() > 0.6
        whole = labelled & (plan.a_length + plan.b_length < 64 - 3)
        assert whole.sum() > 0.2 * len(plan)
        for start, length in ((plan.a_start, plan.a_length), (plan.b_start, plan.b_length)):
            assert all(int(x) in starts for x in start[whole])
            assert all(int(x) in starts for x in (start + length)[whole])
        label = plan.sentence_label[labelled]
        assert abs((label == 0).mean() - 0.5) < sigma_bound(0.5, len(label))


def test_one_sentence_documents_get_no_sentence_label_and_stay_for_mlm(tmp_path):
    data = open_prepared(make_prepared_dir(tmp_path / "data", num_documents=12, validation_documents=1,
                                           max_paragraphs=120))
    index = split_index(data, "train")
    # Make every third document a single sentence (rewrite the offsets of the index, not the files).
    sizes = np.diff(index.document_first)
    cut = [0]
    for number, size in enumerate(sizes):
        cut += [cut[-1] + 1, cut[-1] + size] if number % 3 == 0 and size > 1 else [cut[-1] + size]
    index.document_first = np.asarray(cut, dtype=np.int64)
    single = np.diff(index.document_first) == 1
    for objective in ("sop", "nsp"):
        plan = build_plan(index, objective=objective, max_seq_length=128, short_seq_prob=0.1, seed=3, epoch=0)
        unlabelled = plan.sentence_label == -100
        assert unlabelled[single[plan.document]].all()
        # Elsewhere only a piece of a sentence longer than an instance (MLM only) has no sentence label, or
        # (NSP) a document's last sentence paired with the one before it, whose B a negative replaced, or a
        # pair no negative's B by the rules was found for (~1 in 1,000): A and its positive's B, which follows it.
        sentence = np.searchsorted(index.sentence_cum, plan.a_start, side="right") - 1
        alone = (np.diff(index.sentence_cum)[sentence] > 128 - 3) | np.isin(sentence, index.document_first - 1)
        no_negative_b = unlabelled & ~single[plan.document] & ~alone   # A and its own B: a pair without a label
        assert objective == "nsp" or not no_negative_b.any()
        assert (plan.b_start[no_negative_b] >= plan.a_start[no_negative_b] + plan.a_length[no_negative_b]).all()
        assert no_negative_b.sum() <= max(2, 0.01 * len(plan))
        assert ((plan.a_length >= 1) & (plan.b_length >= 1)).all()
        assert (plan.b_document[unlabelled] == plan.document[unlabelled]).all()
        labelled = plan.sentence_label[~unlabelled]
        assert abs((labelled == 0).mean() - 0.5) < sigma_bound(0.5, len(labelled))


def test_sop_pair_lengths_are_symmetric(prepared):
    # Swapping before a fair truncation and walking windows both ways: (len A, len B) of positives
    # is distributed like (len B, len A); the first [SEP] position no longer tells the label.
    epoch_plans = plans(prepared, "sop", range(8))
    label, a, b = (np.concatenate([getattr(p, k) for p in epoch_plans]) for k in ("sentence_label", "a_length",
                                                                                    "b_length"))
    labelled = label != -100
    label, a, b = label[labelled], a[labelled], b[labelled]
    for feature in (a > b, a % 2 == 1, a == (64 - 3 + 1) // 2):
        rate_given = [(label[feature == value] == 1).mean() for value in (True, False)]
        assert abs(rate_given[0] - rate_given[1]) < 2 * sigma_bound(0.5, min((feature == v).sum() for v in (0, 1)))


def test_short_seq_prob_sets_the_share_of_short_targets_and_chunk_lengths(prepared):
    index = split_index(prepared, "train")
    max_tokens = 64 - 2
    for probability in (0.0, 0.3):
        targets, lengths, reached_end, next_lengths = [], [], [], []
        for epoch in range(6):
            plan = build_plan(index, objective="none", max_seq_length=64, short_seq_prob=probability, seed=2,
                              epoch=epoch)
            targets.append(plan.target)
            lengths.append(plan.a_length)
            end = plan.a_start + plan.a_length
            reached_end.append(end == document_end_token(index, plan.document))
            # What follows: a sentence, or the next piece of a longer sentence (too long to join any chunk).
            after = np.minimum(np.searchsorted(index.sentence_cum, end, side="right") - 1, index.num_sentences - 1)
            next_lengths.append(np.where(index.sentence_cum[after] == end, np.diff(index.sentence_cum)[after],
                                         max_tokens))
        target, length, at_end, next_length = (np.concatenate(x) for x in (targets, lengths, reached_end,
                                                                           next_lengths))
        short = target < max_tokens
        # A short target is uniform in [2, max_tokens]: it equals max_tokens with probability 1/(max_tokens-1).
        expected = probability * (1 - 1 / (max_tokens - 1))
        assert abs(short.mean() - expected) <= max(sigma_bound(expected, len(target)), 1e-9)
        # Chunks are filled up to their target unless the document ends first or the next sentence would
        # not fit: nothing is truncated.
        assert ((length >= target) | at_end | (length + next_length > max_tokens)).all()
        assert (length <= max_tokens).all()
        if probability > 0:
            assert (length[short & ~at_end] < max_tokens).mean() > 0.5


def test_epochs_draw_new_pairs_and_the_same_epoch_is_reproducible(prepared):
    index = split_index(prepared, "train")
    settings = dict(objective="nsp", max_seq_length=64, short_seq_prob=0.1)
    first = build_plan(index, seed=5, epoch=0, **settings)
    again = build_plan(index, seed=5, epoch=0, **settings)
    other = build_plan(index, seed=5, epoch=1, **settings)
    for name in ("a_start", "a_length", "b_start", "b_length", "sentence_label", "order"):
        assert np.array_equal(getattr(first, name), getattr(again, name))
    assert len(first) != len(other) or not np.array_equal(first.a_start, other.a_start)
    assert not np.array_equal(first.order[:100], other.order[:100])


def test_objective_none_gives_single_segments(prepared):
    plan = plans(prepared, "none", range(1))[0]
    assert (plan.b_length == 0).all() and (plan.sentence_label == 0).all()
    assert (plan.a_length <= 64 - 2).all() and (plan.a_length >= 1).all()


def test_nsp_on_a_single_document_is_an_error(tmp_path):
    data = open_prepared(make_prepared_dir(tmp_path / "one", num_documents=3, validation_documents=2,
                                           max_paragraphs=30))
    assert data.split("train").num_documents == 1
    with pytest.raises(DataError, match="NSP needs at least two"):
        epoch_plan(data, DataConfig(objective="nsp"), seed=0, epoch=0)
    plan = epoch_plan(data, DataConfig(objective="sop", max_seq_length=32), seed=0, epoch=0)
    assert len(plan) > 10


def test_plan_memory_scales_with_instances_not_tokens(prepared):
    plan = plans(prepared, "nsp", range(1))[0]
    arrays = [v for v in vars(plan).values() if isinstance(v, np.ndarray)]
    assert all(len(a) == len(plan) for a in arrays)
    assert sum(a.nbytes for a in arrays) < 64 * len(plan)


def test_small_windows_and_blocks_keep_every_rule(prepared, monkeypatch):
    # Book-length documents are chunked in windows and planned in blocks; shrink both to exercise them.
    import bertrain.data.pairs as pairs_module

    monkeypatch.setattr(pairs_module, "WINDOW_SENTENCES", 16)
    monkeypatch.setattr(pairs_module, "BLOCK_SENTENCES", 200)
    index = split_index(prepared, "train")
    for objective in ("nsp", "sop"):
        plan = build_plan(index, objective=objective, max_seq_length=64, short_seq_prob=0.1, seed=4, epoch=0)
        negative = plan.sentence_label == 1
        assert abs((plan.sentence_label[plan.sentence_label != -100] == 0).mean() - 0.5) < sigma_bound(0.5, len(plan))
        assert sorted(plan.order.tolist()) == list(range(len(plan)))
        assert set(plan.document.tolist()) == set(range(index.num_documents))
        same_document = plan.b_document == plan.document
        assert (same_document == ~negative).all() if objective == "nsp" else same_document.all()
        assert ((plan.a_length >= 1) & (plan.b_length >= 1) & (plan.a_length + plan.b_length <= 61)).all()


@pytest.mark.parametrize("max_seq_length", [128, 512])
def test_every_training_token_is_in_an_instance_of_every_epoch(prepared, max_seq_length):
    # Sentences longer than an instance (code blocks here, up to ~2,000 tokens) are cut into pieces, and
    # nothing is truncated unless two whole sentences do not fit together (issue 27: was 74-88%).
    index = split_index(prepared, "train")
    tokens = int(index.sentence_cum[-1])
    for objective in ("nsp", "sop", "none"):
        plan = build_plan(index, objective=objective, max_seq_length=max_seq_length, short_seq_prob=0.1, seed=1,
                          epoch=0)
        held = np.zeros(tokens + 1, np.int64)   # an independent count of the positions the segments hold
        for start, length in ((plan.a_start, plan.a_length), (plan.b_start, plan.b_length)):
            np.add.at(held, start, 1)
            np.add.at(held, start + length, -1)
        assert plan.covered_tokens() == (np.cumsum(held)[:tokens] > 0).sum() >= 0.99 * tokens, objective
        assert (plan.a_length + plan.b_length <= max_seq_length - (2 if objective == "none" else 3)).all()


def test_documents_of_one_unsplittable_run_are_covered(prepared):
    # Documents that are single runs of 2,000+ tokens (no sentence boundary): pieces that train MLM only.
    lengths = np.random.default_rng(0).integers(2000, 5000, 40)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    index = dataclasses.replace(split_index(prepared, "train"), sentence_cum=cum, document_first=np.arange(41),
                                token_base=np.array([0, cum[-1]]))
    for objective, max_seq_length in (("nsp", 128), ("sop", 512), ("none", 128)):
        plan = build_plan(index, objective=objective, max_seq_length=max_seq_length, short_seq_prob=0.1, seed=0,
                          epoch=0)
        assert plan.covered_tokens() >= 0.99 * cum[-1]
        assert objective == "none" or (plan.sentence_label == -100).all()


def test_damaged_offsets_are_a_data_error(tmp_path):
    data_dir = make_prepared_dir(tmp_path / "bad", num_documents=6, validation_documents=1, max_paragraphs=60)
    path = data_dir / "train" / "shard-00000.sentences.npy"
    offsets = np.load(path)
    offsets[3], offsets[4] = offsets[4], offsets[3]
    np.save(path, offsets)
    with pytest.raises(DataError, match="shard-00000.*prepare"):
        epoch_plan(open_prepared(data_dir), DataConfig(objective="sop"), seed=0, epoch=0)
