"""The unpadded (packed) path equals the padded forward: losses, logits and gradients (fp32, dropout 0)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertrain.config import ModelConfig
from bertrain.model import build_model
from bertrain.model.layout import batch_layout, layout_of
from bertrain.model.packing import MAX_BUCKETS, is_right_padded, pack_lengths, plan_buckets
from bertrain.model.unpadded import AUTO_MIN_PADDED_WIDTH, AUTO_MIN_PADDING_SHARE, use_unpadded

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
    labels = torch.where(picked, input_ids, torch.full_like(input_ids, -100))
    input_ids = torch.where(picked, torch.full_like(input_ids, 4), input_ids)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels,
                sentence_label=torch.randint(0, 2, (B,), generator=g))


def perturbed_model(config: ModelConfig, seed: int = 1):
    """Random values everywhere (LayerNorms and biases too), so every weight matters."""
    torch.manual_seed(0)
    model = build_model(config).train()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.ndim == 1 and p.shape[0] <= 64 else 0.0))
    return model


def run(model, forward, batch: dict):
    """(output, per-sequence MLM losses [B], {name: dense gradient}) of one forward + backward."""
    model.zero_grad(set_to_none=True)
    out = forward(**batch)
    logits = out.mlm_logits.clone()  # the training head reuses its buffer on the next forward
    out.loss.backward()
    predicted = batch["labels"] != -100
    token_loss = F.cross_entropy(logits, batch["labels"][predicted], reduction="none")
    row = predicted.nonzero()[:, 0]
    per_sequence = torch.zeros(len(predicted)).index_add_(0, row, token_loss)
    grads = {name: p.grad.to_dense().clone() for name, p in model.named_parameters()}
    return out, logits, per_sequence, grads


def unpadded_forward(model, **batch):
    """The model's forward with model.unpad = true (and the path checked: it must really be taken)."""
    assert use_unpadded("true", layout_of(batch["attention_mask"], batch["labels"]), model.config.hidden_size)
    model.unpad = "true"
    try:
        return model(**batch)
    finally:
        model.unpad = "false"


def padded_forward(model, **batch):
    model.unpad = "false"
    return model(**batch)


def assert_same_as_padded(model, batch: dict) -> None:
    padded, padded_logits, padded_per_seq, padded_grads = run(model, lambda **b: padded_forward(model, **b), batch)
    ours, logits, per_seq, grads = run(model, lambda **b: unpadded_forward(model, **b), batch)
    close = dict(atol=1e-5, rtol=0)
    assert logits.shape == padded_logits.shape
    torch.testing.assert_close(logits, padded_logits, **close)
    torch.testing.assert_close(per_seq, padded_per_seq, **close)
    torch.testing.assert_close(ours.sentence_logits, padded.sentence_logits, **close)
    for name in ("loss", "mlm_loss", "sentence_loss"):
        torch.testing.assert_close(getattr(ours, name), getattr(padded, name), **close)
    assert grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        assert grad.abs().sum() > 0, name  # every parameter is reached, so the comparison means something
        torch.testing.assert_close(grads[name], grad, **close, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_unpadded_equals_padded(name, lengths):
    assert_same_as_padded(perturbed_model(CONFIGS[name]), make_batch(LENGTHS[lengths]))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_unpadded_equals_padded_with_checkpointing_and_without_pruning(name):
    model = perturbed_model(dataclasses.replace(CONFIGS[name], gradient_checkpointing=True))
    assert_same_as_padded(model, make_batch(LENGTHS["varied"], seed=3))
    model.prune_last_layer = False
    assert_same_as_padded(model, make_batch(LENGTHS["varied"], seed=4))


def test_unpadded_equals_padded_in_evaluation():
    model = perturbed_model(CONFIGS["bert"]).eval()
    batch = make_batch(LENGTHS["varied"], seed=5)
    with torch.no_grad():
        padded, ours = padded_forward(model, **batch), unpadded_forward(model, **batch)
    torch.testing.assert_close(ours.mlm_logits, padded.mlm_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.loss, padded.loss, atol=1e-5, rtol=0)


def test_attention_stays_inside_each_sequence():
    model = perturbed_model(CONFIGS["bert"]).eval()
    batch = make_batch(LENGTHS["varied"], seed=6)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["input_ids"][2, 1:17] = torch.randint(5, VOCAB, (16,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before, after = unpadded_forward(model, **batch), unpadded_forward(model, **changed)
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
    assert pack_lengths(np.full(3, 7), 7)[0].buckets[0].key_mask is None


def test_when_the_unpadded_path_is_used():
    batch = make_batch(LENGTHS["varied"])
    layout = layout_of(batch["attention_mask"], batch["labels"])
    assert layout.padding_share >= AUTO_MIN_PADDING_SHARE
    assert use_unpadded("auto", layout, 8) and use_unpadded("true", layout, 8)  # much padding: at any width
    assert not use_unpadded("false", layout, 4096)
    little = make_batch([WIDTH, WIDTH, WIDTH, 12])  # 12.5% padding: only from a large enough hidden size
    little_layout = layout_of(little["attention_mask"], little["labels"])
    share = little_layout.padding_share
    assert share < AUTO_MIN_PADDING_SHARE
    big, small = int(AUTO_MIN_PADDED_WIDTH / share) + 1, int(AUTO_MIN_PADDED_WIDTH / share) - 1
    assert use_unpadded("auto", little_layout, big) and not use_unpadded("auto", little_layout, small)
    full = make_batch(LENGTHS["all_full"])
    full_layout = layout_of(full["attention_mask"], full["labels"])
    assert not use_unpadded("auto", full_layout, 4096)  # nothing to remove
    assert use_unpadded("true", full_layout, 32)
    left_padded = batch["attention_mask"].flip(1)
    assert not is_right_padded(left_padded.bool().numpy())
    assert layout_of(left_padded, batch["labels"].flip(1)).packing is None  # padded path only


def test_labels_at_padding_keep_the_padded_path():
    batch = make_batch(LENGTHS["varied"])
    batch["labels"][1, -1] = 7
    layout = batch_layout(batch["attention_mask"].numpy(), batch["labels"].numpy())
    assert layout.packing is None and not use_unpadded("true", layout, 768)


def test_collator_layout_equals_the_masks():
    """The host-built index tensors pick exactly what boolean-mask indexing picks."""
    batch = make_batch(LENGTHS["varied"], seed=9)
    labels, mask = batch["labels"], batch["attention_mask"]
    layout = batch_layout(mask.numpy(), labels.numpy(), batch["sentence_label"].numpy())
    predicted = labels != -100
    assert layout.predicted == int(predicted.sum()) and layout.real_tokens == int(mask.sum())
    assert torch.equal(layout.targets, labels[predicted])
    assert torch.equal(layout.mlm_index, predicted.reshape(-1).nonzero()[:, 0])
    needed = predicted.clone()
    needed[:, 0] = True
    reference_rows = torch.sort(needed.to(torch.uint8), dim=1, descending=True, stable=True).indices
    assert torch.equal(layout.needed_rows, reference_rows[:, :layout.max_needed])
    picked = predicted.gather(1, layout.needed_rows).reshape(-1).nonzero()[:, 0]
    assert torch.equal(layout.mlm_index_in_rows, picked)
