"""The unpadded (packed) path equals the padded forward: losses, logits and gradients (fp32, dropout 0), up to
float32 rounding (another summation order)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertrain.batch_layout import (IGNORE_INDEX, MAX_BUCKETS, batch_layout, buckets_of, is_right_padded, layout_of,
                                   pack_lengths, plan_buckets)
from bertrain.config import AUTO_MIN_PADDED_WIDTH, AUTO_MIN_PADDING_SHARE, ModelConfig
from bertrain.model import build_model, layers
from bertrain.model.forward_plan import plan_forward
from tests.helpers import assert_rounding_close

VOCAB, WIDTH = 97, 24
CONFIGS = {
    "bert": ModelConfig(type="bert", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=WIDTH, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0),
    "albert": ModelConfig(type="albert", vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                          num_hidden_groups=2, inner_group_num=2, num_attention_heads=4, intermediate_size=64,
                          max_position_embeddings=WIDTH, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0),
}
LENGTHS = {
    "varied": [WIDTH, 3, 17, 1, 9, WIDTH, 12, 2],   # 1: a row with only [CLS], nothing predicted
    "all_full": [WIDTH] * 4,
    "single_short": [5],
}


def make_batch(lengths: list[int], seed: int = 0) -> dict:
    """Right-padded rows of these lengths, two segments, ~25% of the real tokens after [CLS] predicted."""
    g = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths)
    B = len(lengths)
    attention_mask = (torch.arange(WIDTH)[None, :] < lengths_t[:, None]).long()
    input_ids = torch.randint(5, VOCAB, (B, WIDTH), generator=g) * attention_mask
    input_ids[:, 0] = 2
    token_type_ids = ((torch.arange(WIDTH)[None, :] >= lengths_t[:, None] // 2) & attention_mask.bool()).long()
    picked = (torch.rand(B, WIDTH, generator=g) < 0.25) & attention_mask.bool()
    picked[:, 0] = False
    picked[0, min(lengths[0] - 1, 3)] = lengths[0] > 1
    labels = torch.where(picked, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    input_ids = torch.where(picked, torch.full_like(input_ids, 4), input_ids)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels,
                sentence_label=torch.randint(0, 2, (B,), generator=g))


def perturbed_model(config: ModelConfig, seed: int = 1, **options):
    """Random values everywhere (LayerNorms and biases too), so every weight matters."""
    torch.manual_seed(0)
    model = build_model(config, **options).train()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.ndim == 1 and p.shape[0] <= 64 else 0.0))
    return model


def run(model, batch: dict, encoder: str):
    """(output, MLM logits, per-sequence MLM losses [B], {name: dense gradient}) of one forward + backward
    on the `encoder` path (checked: it must really be taken)."""
    model.zero_grad(set_to_none=True)
    assert plan_forward(model, layout_of(batch["attention_mask"], batch["labels"])).encoder == encoder
    out = model(**batch)
    logits = out.mlm_logits.detach()
    out.loss.backward()
    predicted = batch["labels"] != IGNORE_INDEX
    token_loss = F.cross_entropy(logits, batch["labels"][predicted], reduction="none")
    row = predicted.nonzero()[:, 0]
    per_sequence = torch.zeros(len(predicted)).index_add_(0, row, token_loss)
    grads = {name: p.grad.to_dense().clone() for name, p in model.named_parameters()}
    return out, logits, per_sequence, grads


def twins(config: ModelConfig, **options):
    """(the model with model.unpad false, the same weights with unpad true); `options` for the padded one."""
    padded = perturbed_model(dataclasses.replace(config, unpad="false"), **options)
    return padded, perturbed_model(dataclasses.replace(config, unpad="true"))


def rounding(config: ModelConfig, batch: dict) -> dict:
    """rounding_rtol's K and steps here: a weight gradient's sum over the batch's tokens (or the vocabulary's
    softmax), each layer carrying the earlier ones' rounding. About 1e-5 of the largest value: a LayerNorm eps of
    1e-6 instead of 1e-12, or one attention weight off by 1% of the weights' scale, fails."""
    return dict(reduction_length=max(batch["input_ids"].numel(), VOCAB), steps=config.num_hidden_layers)


def assert_same_as_padded(config: ModelConfig, batch: dict, **options) -> None:
    padded_model, packed_model = twins(config, **options)
    encoder = "pruned" if options.get("prune_last_layer", True) else "padded"
    padded, padded_logits, padded_per_seq, padded_grads = run(padded_model, batch, encoder)
    ours, logits, per_seq, grads = run(packed_model, batch, "packed")
    close = rounding(config, batch)
    assert_rounding_close(logits, padded_logits, **close, name="mlm logits")
    assert_rounding_close(per_seq, padded_per_seq, **close, name="per-sequence loss")
    assert_rounding_close(ours.sentence_logits, padded.sentence_logits, **close, name="sentence logits")
    for name in ("loss", "mlm_loss", "sentence_loss"):
        assert_rounding_close(getattr(ours, name), getattr(padded, name), **close, name=name)
    assert grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        assert grad.abs().sum() > 0, name  # every parameter is reached, so the comparison means something
        assert_rounding_close(grads[name], grad, **close, name=name)


@pytest.mark.cross_path
@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_unpadded_equals_padded(name, lengths):
    assert_same_as_padded(CONFIGS[name], make_batch(LENGTHS[lengths]))


@pytest.mark.cross_path
@pytest.mark.parametrize("name", list(CONFIGS))
def test_unpadded_equals_padded_with_checkpointing_and_without_pruning(name):
    config = dataclasses.replace(CONFIGS[name], gradient_checkpointing=True)
    assert_same_as_padded(config, make_batch(LENGTHS["varied"], seed=3))
    assert_same_as_padded(config, make_batch(LENGTHS["varied"], seed=4), prune_last_layer=False)


@pytest.mark.cross_path
def test_unpadded_equals_padded_in_evaluation():
    padded_model, packed_model = (model.eval() for model in twins(CONFIGS["bert"]))
    batch = make_batch(LENGTHS["varied"], seed=5)
    with torch.no_grad():
        padded, ours = padded_model(**batch), packed_model(**batch)
    close = rounding(CONFIGS["bert"], batch)
    assert_rounding_close(ours.mlm_logits, padded.mlm_logits, **close, name="mlm logits")
    assert_rounding_close(ours.loss, padded.loss, **close, name="loss")


def flash_stand_in(calls: list):
    """aten._flash_attention_forward's contract (rows [N, heads, d], sequences bounded by cumulative starts, the
    longest length given) in plain per-sequence SDPA: the GPU path's plumbing, checked on a CPU."""

    def flash(q, k, v, starts_q, starts_k, longest_q, longest_k, dropout_p, is_causal, debug_mask):
        assert starts_q.dtype == torch.int32 and torch.equal(starts_q, starts_k) and longest_q == longest_k
        assert int(starts_q[0]) == 0 and int(starts_q[-1]) == len(q) and dropout_p == 0.0 and not is_causal
        lengths = starts_q.diff()
        assert bool(((lengths > 0) & (lengths <= longest_q)).all())
        calls.append(int(lengths.max()) == longest_q)
        return per_sequence_attention(q, k, v, starts_q), None, None, None, None

    return flash


def per_sequence_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Rows [N, heads, d] → [N, heads, d]: plain SDPA within each sequence that `starts` (cumulative) bounds."""
    outputs = []
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        rows = [t[a:b].transpose(0, 1) for t in (q, k, v)]                      # [heads, length, d]
        outputs.append(F.scaled_dot_product_attention(*rows).transpose(0, 1))
    return torch.cat(outputs)


@pytest.mark.cross_path
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_gpus_variable_length_attention_equals_the_padded_path(name, monkeypatch):
    calls = []
    monkeypatch.setattr(layers, "varlen_flash_available", lambda qkv, num_heads: True)
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", flash_stand_in(calls))
    assert_same_as_padded(CONFIGS[name], make_batch(LENGTHS["varied"], seed=7))
    assert calls and all(calls)  # the packed forward went through it, with the longest length


def test_attention_stays_inside_each_sequence():
    model = twins(CONFIGS["bert"])[1].eval()
    batch = make_batch(LENGTHS["varied"], seed=6)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["input_ids"][2, 1:17] = torch.randint(5, VOCAB, (16,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before, after = model(**batch), model(**changed)
    other = torch.arange(len(LENGTHS["varied"])) != 2
    torch.testing.assert_close(after.sentence_logits[other], before.sentence_logits[other], atol=0, rtol=0)
    assert not torch.equal(after.sentence_logits[2], before.sentence_logits[2])


def test_bucket_plan_covers_every_sequence_once_longest_first():
    lengths = np.random.default_rng(0).integers(1, 513, 40)
    buckets = plan_buckets(lengths)
    assert 1 <= len(buckets) <= MAX_BUCKETS
    assert sorted(np.concatenate(buckets).tolist()) == list(range(40))
    assert all(lengths[a].min() >= lengths[b].max() for a, b in zip(buckets, buckets[1:]))
    assert len(plan_buckets(np.array([7, 7, 7]))) == 1  # equal lengths: one bucket, no mask
    assert buckets_of(pack_lengths(np.full(3, 7), 7)[0])[0].key_mask is None


def test_buckets_are_made_on_first_use_once_on_the_packing_device():
    """The collator plans no buckets (a GPU's variable-length kernel never reads them); buckets_of plans them from
    the host lengths, in the packed order pack_lengths laid out, with the tensors where the packing's are."""
    lengths = np.random.default_rng(1).integers(1, 65, 24)
    packing = pack_lengths(lengths, 64)[0]
    assert packing.buckets is None
    moved = dataclasses.replace(packing, token_index=packing.token_index.to("meta"))
    buckets = buckets_of(moved)
    assert buckets_of(moved) is buckets  # made once: every layer's attention shares them
    assert all(t.is_meta for b in buckets for t in (b.gather, b.key_mask, b.inside) if t is not None)
    members = plan_buckets(lengths)
    assert len(buckets) == len(members) > 1 and sum(b.size for b in buckets) == int(lengths.sum())
    for bucket, rows in zip(buckets, members):  # each sequence's packed rows lie in its bucket, longest first
        first = packing.first_rows[rows].numpy()
        assert first.tolist() == (bucket.start + np.concatenate([[0], np.cumsum(lengths[rows])[:-1]])).tolist()


def planned(layout, unpad: str = "auto", hidden_size: int = 32, **options) -> tuple[str, bool]:
    """(encoder path, sparse embedding gradient) that plan_forward picks for a model of these settings."""
    model = SimpleNamespace(unpad=unpad, config=SimpleNamespace(hidden_size=hidden_size), training=True,
                            decoder_weight=torch.zeros(1, requires_grad=True),
                            **{"prune_last_layer": True, "sparse_embedding_grad": True, **options})
    plan = plan_forward(model, layout)
    assert set(plan.why) == {"encoder", "embedding_grad"} and all(plan.why.values())
    return plan.encoder, plan.sparse_embedding_grad


def test_the_forward_plan_takes_each_path_when_it_should():
    batch = make_batch(LENGTHS["varied"])
    layout = layout_of(batch["attention_mask"], batch["labels"])
    assert layout.padding_share >= AUTO_MIN_PADDING_SHARE
    assert planned(layout, "auto", 8) == planned(layout, "true", 8) == ("packed", True)  # much padding: any width
    assert planned(layout, "false", 4096) == ("pruned", True)
    assert planned(layout, "false", prune_last_layer=False) == ("padded", True)
    assert planned(layout, sparse_embedding_grad=False) == ("packed", False)
    with torch.no_grad():
        assert planned(layout) == ("packed", False)  # no gradient: nothing to make sparse
    little = make_batch([WIDTH, WIDTH, WIDTH, 12])  # 12.5% padding: only from a large enough hidden size
    little_layout = layout_of(little["attention_mask"], little["labels"])
    share = little_layout.padding_share
    assert share < AUTO_MIN_PADDING_SHARE
    big, small = int(AUTO_MIN_PADDED_WIDTH / share) + 1, int(AUTO_MIN_PADDED_WIDTH / share) - 1
    assert planned(little_layout, "auto", big)[0] == "packed" and planned(little_layout, "auto", small)[0] == "pruned"
    full = make_batch(LENGTHS["all_full"])
    full_layout = layout_of(full["attention_mask"], full["labels"])
    assert planned(full_layout, "auto", 4096)[0] == "pruned"  # nothing to remove
    assert planned(full_layout, "true")[0] == "packed"
    left_padded = batch["attention_mask"].flip(1)
    assert not is_right_padded(left_padded.bool().numpy())
    assert layout_of(left_padded, batch["labels"].flip(1)).packing is None  # padded path only


def test_labels_at_padding_keep_the_padded_path():
    batch = make_batch(LENGTHS["varied"])
    batch["labels"][1, -1] = 7
    layout = batch_layout(batch["attention_mask"].numpy(), batch["labels"].numpy())
    assert layout.packing is None and planned(layout, "true", 768)[0] == "pruned"


def test_right_padded_means_a_real_prefix_in_every_row():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        B, T = rng.integers(0, 4), rng.integers(0, 5)
        lengths = rng.integers(0, T + 1, B)
        real = np.arange(T)[None, :] < lengths[:, None] if rng.random() < 0.5 else rng.random((B, T)) < 0.7
        prefix = np.arange(T)[None, :] < real.sum(1)[:, None]
        assert is_right_padded(real) == bool((real.sum(1) > 0).all() and (prefix == real).all())


def test_collator_layout_equals_the_masks():
    """The host-built index tensors pick exactly what boolean-mask indexing picks."""
    batch = make_batch(LENGTHS["varied"], seed=9)
    labels, mask = batch["labels"], batch["attention_mask"]
    layout = batch_layout(mask.numpy(), labels.numpy(), batch["sentence_label"].numpy())
    predicted = labels != IGNORE_INDEX
    assert layout.predicted == int(predicted.sum()) and layout.real_tokens == int(mask.sum())
    assert torch.equal(layout.targets, labels[predicted])
    assert torch.equal(layout.mlm_index, predicted.reshape(-1).nonzero()[:, 0])
    needed = predicted.clone()
    needed[:, 0] = True
    reference_rows = torch.sort(needed.to(torch.uint8), dim=1, descending=True, stable=True).indices
    assert torch.equal(layout.needed_rows, reference_rows[:, :layout.max_needed])
    picked = predicted.gather(1, layout.needed_rows).reshape(-1).nonzero()[:, 0]
    assert torch.equal(layout.mlm_index_in_rows, picked)
