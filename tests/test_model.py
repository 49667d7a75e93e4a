"""bertrain's BERT and ALBERT against transformers' BertForPreTraining / AlbertForPreTraining."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertrain.config import ModelConfig
from bertrain.errors import ConfigError, DataError
from bertrain.batch_layout import IGNORE_INDEX, layout_of
from bertrain.model import build_model, load_weights, save_weights
from bertrain.model.forward_plan import plan_forward
from bertrain.model.hf import export_hf, import_hf
from bertrain.model.layers import EncoderLayer, split_heads
from tests.helpers import assert_rounding_close

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 211
CONFIGS = {
    "bert": ModelConfig(type="bert", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1),
    "bert-relu": ModelConfig(type="bert", vocab_size=VOCAB, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                             intermediate_size=48, max_position_embeddings=40, hidden_act="relu", type_vocab_size=3),
    "albert": ModelConfig(type="albert", vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=40,
                          hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "albert-groups": ModelConfig(type="albert", vocab_size=VOCAB, embedding_size=16, hidden_size=32,
                                 num_hidden_layers=4, num_hidden_groups=2, inner_group_num=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=40, hidden_act="gelu_new"),
}


def padded_batch(seed: int = 0, batch: int = 4, length: int = 24) -> dict:
    """Rows of different lengths (padding on the right), two segments, ~20% of real tokens predicted."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([length, length - 7, length - 13, 9][:batch])
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(5, VOCAB, (batch, length), generator=g) * attention_mask
    input_ids[:, 0] = 2
    token_type_ids = ((torch.arange(length)[None, :] >= (lengths[:, None] // 2)) & attention_mask.bool()).long()
    picked = (torch.rand(batch, length, generator=g) < 0.2) & attention_mask.bool()
    picked[:, 0] = False
    picked[0, 3] = True
    labels = torch.where(picked, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    input_ids = torch.where(picked, torch.full_like(input_ids, 4), input_ids)
    sentence_label = torch.randint(0, 2, (batch,), generator=g)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels,
                sentence_label=sentence_label)


def reference_outputs(hf_model, batch: dict, kind: str):
    label_key = "sentence_order_label" if kind == "albert" else "next_sentence_label"
    out = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                   **{label_key: batch["sentence_label"]})
    sentence_logits = out.sop_logits if kind == "albert" else out.seq_relationship_logits
    predicted = batch["labels"] != IGNORE_INDEX
    mlm_logits = out.prediction_logits[predicted]
    mlm_loss = torch.nn.functional.cross_entropy(mlm_logits, batch["labels"][predicted])
    sentence_loss = torch.nn.functional.cross_entropy(sentence_logits, batch["sentence_label"])
    return out.loss, mlm_loss, sentence_loss, mlm_logits, sentence_logits


def rounding(config: ModelConfig, batch: dict) -> dict:
    """rounding_rtol's K and steps for two implementations of these models: the vocabulary's softmax or a weight
    gradient's sum over the batch's tokens, each layer carrying the earlier ones' rounding. About 1e-5 of the
    largest value: logits of a LayerNorm eps of 1e-4 instead of 1e-12 fail (of 1e-5, in 3 configs of 4)."""
    return dict(reduction_length=max(VOCAB, batch["input_ids"].numel()), steps=config.num_hidden_layers)


def assert_agree(ours, reference, config: ModelConfig, batch: dict) -> None:
    loss, mlm_loss, sentence_loss, mlm_logits, sentence_logits = reference
    close = rounding(config, batch)
    assert_rounding_close(ours.mlm_logits, mlm_logits, **close, name="mlm logits")
    assert_rounding_close(ours.sentence_logits, sentence_logits, **close, name="sentence logits")
    assert_rounding_close(ours.mlm_loss, mlm_loss, **close, name="mlm loss")
    assert_rounding_close(ours.sentence_loss, sentence_loss, **close, name="sentence loss")
    assert_rounding_close(ours.loss, loss, **close, name="loss")


def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Random values everywhere (LayerNorms and biases too), so every weight matters in the comparison."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.ndim == 1 and p.shape[0] <= 64 else 0.0))


@pytest.mark.cross_path
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_exported_model_matches_transformers(tmp_path, name, attn):
    config = CONFIGS[name]
    torch.manual_seed(1)
    ours = build_model(config)
    perturb_(ours, seed=2)
    ours.eval()
    export_hf(ours, tmp_path)
    theirs, info = transformers.AutoModelForPreTraining.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation=attn)
    assert not any(info.values()), info
    theirs.eval()
    batch = padded_batch()
    with torch.no_grad():
        assert_agree(ours(**batch), reference_outputs(theirs, batch, config.type), config, batch)


@pytest.mark.cross_path
@pytest.mark.parametrize("name", ["bert", "albert-groups"])
def test_imported_transformers_weights_give_the_same_outputs(tmp_path, name):
    config = CONFIGS[name]
    from bertrain.model.hf import hf_config

    values = hf_config(config)
    cls = transformers.AlbertConfig if config.type == "albert" else transformers.BertConfig
    model_cls = transformers.AlbertForPreTraining if config.type == "albert" else transformers.BertForPreTraining
    theirs = model_cls(cls(**{k: v for k, v in values.items() if k not in ("model_type",)}))
    perturb_(theirs, seed=3)
    theirs.save_pretrained(tmp_path)
    theirs.eval()
    ours, imported_config = import_hf(tmp_path)
    assert imported_config == dataclasses.replace(config, gradient_checkpointing=False, init_from=None)
    batch = padded_batch(seed=4)
    with torch.no_grad():
        assert_agree(ours(**batch), reference_outputs(theirs, batch, config.type), config, batch)
    # The tie survives the round trip: our decoder is the embedding, theirs too.
    assert theirs.get_output_embeddings().weight is theirs.get_input_embeddings().weight
    torch.testing.assert_close(ours.decoder_weight, theirs.get_input_embeddings().weight, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["bert", "albert-groups"])
def test_gradients_reach_every_parameter_and_the_tie_holds_after_a_step(tmp_path, name):
    config = CONFIGS[name]
    torch.manual_seed(0)
    model = build_model(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = padded_batch(seed=5)
    model(**batch).loss.backward()
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, parameter_name
    optimizer.step()
    model.eval()
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        hidden = model.encode(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        head = model.mlm_head
        manual = torch.nn.functional.linear(head.layer_norm(head.act(head.dense(hidden))),
                                            model.embeddings.word_embeddings.weight, head.bias)
    assert torch.equal(out.mlm_logits, manual)  # the head's own operations, decoding with the word embeddings
    # After the step, export/import: transformers ties its decoder to the (updated) embeddings.
    export_hf(model, tmp_path)
    theirs = transformers.AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert theirs.get_output_embeddings().weight is theirs.get_input_embeddings().weight
    torch.testing.assert_close(theirs.get_input_embeddings().weight, model.decoder_weight, atol=0, rtol=0)
    back, _ = import_hf(tmp_path)
    with torch.no_grad():
        assert torch.equal(back(**batch).mlm_logits, model(**batch).mlm_logits)  # same weights, same code


@pytest.mark.cross_path
def test_masked_only_logits_are_the_full_logits_at_labelled_positions_in_row_major_order():
    model = build_model(CONFIGS["bert"]).eval()
    batch = padded_batch(seed=6)
    with torch.no_grad():
        full = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).mlm_logits
        out = model(**batch)
    assert full.shape == (*batch["input_ids"].shape, VOCAB)
    predicted = batch["labels"] != IGNORE_INDEX
    assert out.mlm_logits.shape[0] == int(predicted.sum())
    # The last layer at the labelled rows only, the head on fewer rows: other kernels, other rounding.
    assert_rounding_close(out.mlm_logits, full[predicted], **rounding(model.config, batch))


def test_without_sentence_label_the_loss_is_the_mlm_loss():
    model = build_model(CONFIGS["albert"]).eval()
    batch = padded_batch(seed=7)
    batch.pop("sentence_label")
    out = model(**batch)
    assert out.sentence_loss is None and out.sentence_logits.shape == (4, 2)
    assert out.loss is out.mlm_loss
    model.train()
    out = model(**batch)
    assert torch.equal(out.loss.detach(), out.mlm_loss.detach())
    out.loss.backward()  # every parameter has a gradient (DDP needs one), zero for the unused sentence head
    assert all(p.grad is not None for p in model.parameters())
    assert model.sentence_head.weight.grad.abs().sum() == 0
    expected = torch.nn.functional.cross_entropy(out.mlm_logits, batch["labels"][batch["labels"] != IGNORE_INDEX])
    torch.testing.assert_close(out.mlm_loss, expected)


def test_no_predicted_position_gives_a_zero_mlm_loss_that_backpropagates():
    model = build_model(CONFIGS["bert"]).train()
    batch = padded_batch(seed=8)
    batch["labels"].fill_(IGNORE_INDEX)
    out = model(**batch)
    assert out.mlm_logits.shape == (0, VOCAB) and out.mlm_loss.item() == 0.0
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.sentence_head.weight.grad.abs().sum() > 0


def test_gradient_checkpointing_gives_the_same_gradients():
    config = CONFIGS["albert-groups"]
    torch.manual_seed(0)
    plain = build_model(config).train()
    checkpointed = build_model(dataclasses.replace(config, gradient_checkpointing=True)).train()
    checkpointed.load_state_dict(plain.state_dict())
    batch = padded_batch(seed=9)
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # same dropout masks; checkpointing replays them in the recomputation
        model(**batch).loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        assert torch.equal(a.grad, b.grad), name  # the recomputation is the same computation


def test_dropout_is_active_in_training_and_off_in_eval():
    model = build_model(CONFIGS["bert"])
    batch = padded_batch(seed=10)
    model.train()
    assert model(**batch).mlm_loss.item() != model(**batch).mlm_loss.item()
    model.eval()
    assert torch.equal(model(**batch).mlm_logits, model(**batch).mlm_logits)


def test_initialization_follows_bert():
    config = dataclasses.replace(CONFIGS["bert"], hidden_size=64, intermediate_size=256, initializer_range=0.05)
    model = build_model(config)
    layer_norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(layer_norms) == 1 + 2 * config.num_hidden_layers + 1
    for norm in layer_norms:
        assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)
    weights = torch.cat([p.flatten() for n, p in model.named_parameters() if p.ndim == 2])
    weights = weights.detach()
    assert abs(float(weights.std()) - 0.05) < 0.002 and abs(float(weights.mean())) < 0.002
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name


def test_build_model_refuses_a_missing_vocab_size():
    with pytest.raises(ConfigError, match="vocab_size"):
        build_model(dataclasses.replace(CONFIGS["bert"], vocab_size=None))
    with pytest.raises(ConfigError, match="divisible"):
        build_model(dataclasses.replace(CONFIGS["bert"], num_attention_heads=5))


def test_save_and_load_weights_round_trip_and_refuse_another_shape(tmp_path):
    model = build_model(CONFIGS["albert-groups"])
    perturb_(model, seed=11)
    save_weights(model, tmp_path / "model.safetensors")
    fresh = build_model(CONFIGS["albert-groups"])
    load_weights(fresh, tmp_path / "model.safetensors")
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
    other = build_model(dataclasses.replace(CONFIGS["albert-groups"], vocab_size=VOCAB + 1))
    with pytest.raises(DataError, match="word_embeddings"):
        load_weights(other, tmp_path / "model.safetensors")


@pytest.mark.cross_path
@pytest.mark.parametrize("float32_residual", [False, True])
def test_bf16_autocast_runs_and_stays_close_to_fp32(float32_residual):
    model = build_model(dataclasses.replace(CONFIGS["bert"], float32_residual=float32_residual)).eval()
    batch = padded_batch(seed=12)
    with torch.no_grad():
        reference = model(**batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(**batch)
    assert low.mlm_loss.dtype == torch.float32
    # bf16 rounds the inputs and outputs of each layer's matmuls (K = 1: they sum in fp32): 5% of the largest
    # logit, enough to catch a padded position attended to or a layer skipped.
    for name in ("mlm_logits", "loss"):
        assert_rounding_close(getattr(low, name), getattr(reference, name), 1, CONFIGS["bert"].num_hidden_layers,
                              torch.bfloat16, name=name)


@pytest.mark.parametrize("name", ["bert", "albert"])
def test_bf16_autocast_keeps_the_residual_stream_in_bf16_and_casts_no_activation(name):
    """Under autocast each layer takes and gives bf16 and casts only weights (and their gradients); with
    model.float32_residual as CUDA's autocast: float32 between layers and activation casts. Without autocast the
    flag changes nothing."""
    batch = padded_batch(seed=13, batch=3, length=22)  # 66 positions: no parameter has a dimension of 66 or 22
    activation_casts, layer_outputs, losses = {}, {}, {}
    for float32_residual in (False, True):
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(CONFIGS[name], float32_residual=float32_residual, unpad="false"),
                            prune_last_layer=False).train()
        losses[float32_residual] = model(**batch).loss
        dtypes = []
        for layer in model.encoder.modules():
            if isinstance(layer, EncoderLayer):
                layer.register_forward_hook(lambda module, args, out: dtypes.append((args[0].dtype, out.dtype)))
        casts = CastShapes()
        with torch.autocast("cpu", dtype=torch.bfloat16), casts:
            model(**batch).loss.backward()
        layer_outputs[float32_residual] = set(dtypes)
        activation_casts[float32_residual] = [s for s in casts.shapes if 66 in s or s[:2] == (3, 22)]
    assert {dtype for pair in layer_outputs[False] for dtype in pair} == {torch.bfloat16}
    assert {output for _, output in layer_outputs[True]} == {torch.float32}
    # the embeddings' float32 sum is cast once to bf16 at its LayerNorm's output (and its gradient back)
    assert sorted(activation_casts[False]) == [(3, 22, CONFIGS[name].embedding_size or 32)] * 2
    assert len(activation_casts[True]) > 2 * CONFIGS[name].num_hidden_layers
    assert torch.equal(losses[False], losses[True])


class CastShapes(TorchDispatchMode):
    """The shapes of the floating-point tensors cast (aten._to_copy) inside it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].is_floating_point():
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.cross_path
@pytest.mark.parametrize("name", ["bert", "albert-groups"])
def test_last_layer_at_needed_rows_only_gives_the_full_outputs_and_gradients(name):
    config = dataclasses.replace(CONFIGS[name], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 gradient_checkpointing=name == "albert-groups", unpad="false")
    pruned = build_model(config).train()
    batch = padded_batch(seed=14)
    # One sentence label for every row: an untrained model pools nearly the same vector from each row, so opposite
    # labels cancel the sentence head's and the pooler's gradients to ~1/1000 of the terms they sum, and their error
    # relative to that remainder measures the cancellation, not the two paths (1 in 100 random weights failed).
    batch["sentence_label"].zero_()
    results = []
    for prune in (True, False):
        model = build_model(config, prune_last_layer=prune).train()
        model.load_state_dict(pruned.state_dict())
        assert plan_forward(model, layout_of(batch["attention_mask"], batch["labels"])).encoder == (
            "pruned" if prune else "padded")
        out = model(**batch)
        out.loss.backward()
        with torch.no_grad():
            logits = model.eval()(**batch).mlm_logits  # eval logits are fresh tensors
        model.train()
        results.append((logits, out.mlm_predictions, out.sentence_logits.detach(), out.loss.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters()}))
    (logits, predictions, sentence, loss, grads), (logits_full, predictions_full, sentence_full, loss_full,
                                                   grads_full) = results
    assert torch.equal(predictions, logits.argmax(-1)) and torch.equal(predictions_full, logits_full.argmax(-1))
    close = rounding(config, batch)
    assert_rounding_close(logits, logits_full, **close, name="mlm logits")
    assert_rounding_close(sentence, sentence_full, **close, name="sentence logits")
    assert_rounding_close(loss, loss_full, **close, name="loss")
    for name_ in grads:
        assert_rounding_close(grads[name_], grads_full[name_], **close, name=name_)


@pytest.mark.cross_path
def test_counts_and_summed_losses_match_the_logits():
    model = build_model(CONFIGS["bert"]).eval()
    batch = padded_batch(seed=15)
    with torch.no_grad():
        out = model(**batch)
    targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
    assert torch.equal(out.mlm_predictions, out.mlm_logits.argmax(-1))
    assert int(out.mlm_correct) == int((out.mlm_logits.argmax(-1) == targets).sum())
    assert int(out.sentence_correct) == int((out.sentence_logits.argmax(-1) == batch["sentence_label"]).sum())
    expected = torch.nn.functional.cross_entropy(out.mlm_logits, targets, reduction="sum")
    assert_rounding_close(out.mlm_loss_sum, expected, 2)  # the mean times N: two roundings more than the sum
    assert torch.equal(out.sentence_loss_sum, torch.nn.functional.cross_entropy(  # the model's own call
        out.sentence_logits, batch["sentence_label"], reduction="sum"))


def test_instances_without_a_sentence_label_train_mlm_only():
    # data/pairs.py gives one-sentence documents no sentence label: no sentence loss, accuracy or count.
    model = build_model(CONFIGS["albert"]).eval()
    batch = padded_batch(seed=16)
    batch["sentence_label"] = torch.tensor([1, IGNORE_INDEX, 0, IGNORE_INDEX])
    with torch.no_grad():
        out = model(**batch)
    labelled = batch["sentence_label"] != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(out.sentence_logits[labelled], batch["sentence_label"][labelled])
    torch.testing.assert_close(out.sentence_loss, expected)
    assert int(out.sentence_count) == 2
    assert int(out.sentence_correct) == int((out.sentence_logits[labelled].argmax(-1)
                                             == batch["sentence_label"][labelled]).sum())
    batch["sentence_label"] = torch.full((4,), IGNORE_INDEX)  # no labelled instance: finite, MLM only
    model.train()
    out = model(**batch)
    assert torch.isfinite(out.loss) and float(out.sentence_loss.detach()) == 0.0 and int(out.sentence_count) == 0
    torch.testing.assert_close(out.loss.detach(), out.mlm_loss.detach())


@pytest.mark.cross_path
@pytest.mark.parametrize("name", ["bert", "albert-groups"])
def test_normalizers_make_split_batches_give_the_whole_batch_gradient(name):
    # What data parallelism and accumulation rely on: two halves, each normalized by the whole
    # batch's counts, sum to the gradient of the whole batch's mean losses.
    config = dataclasses.replace(CONFIGS[name], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = build_model(config).train()
    batch = padded_batch(seed=16)
    model(**batch).loss.backward()
    whole = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    predicted, instances = int((batch["labels"] != IGNORE_INDEX).sum()), batch["input_ids"].shape[0]
    for half in (slice(0, 2), slice(2, 4)):
        part = {k: v[half] for k, v in batch.items()}
        out = model(**part, mlm_normalizer=float(predicted), sentence_normalizer=float(instances))
        n = int((part["labels"] != IGNORE_INDEX).sum())
        # Four roundings of at most eps/2 on each side: K = 4.
        assert_rounding_close(out.loss, out.mlm_loss * n / predicted + out.sentence_loss * 2 / instances, 4)
        out.loss.backward()
    for parameter_name, parameter in model.named_parameters():
        assert_rounding_close(parameter.grad, whole[parameter_name], **rounding(config, batch), name=parameter_name)


class _BackwardOps(TorchDispatchMode):
    """The aten ops that run while active (here: in a backward)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_split_heads_backward_is_autograds_gradient_in_one_copy(parts):
    B, T, heads, d = 3, 7, 4, 5
    g = torch.Generator().manual_seed(parts)
    upstream = [torch.randn(B, heads, T, d, generator=g) for _ in range(parts)]
    upstream[0] = upstream[0].transpose(2, 3).contiguous().transpose(2, 3)  # a strided gradient too

    def gradient(split) -> tuple[torch.Tensor, list[str]]:
        projected = torch.randn(B, T, parts * heads * d, generator=torch.Generator().manual_seed(0), requires_grad=True)
        outputs = split(projected)
        with _BackwardOps() as recorded:
            torch.autograd.backward(outputs, upstream)
        return projected.grad, recorded.ops

    def autograd_unbind(projected):  # the layer's code before split_heads
        return projected.view(B, T, parts, heads, d).permute(2, 0, 3, 1, 4).unbind(0)

    ours, our_ops = gradient(lambda projected: split_heads(projected, parts, heads))
    reference, reference_ops = gradient(autograd_unbind)
    assert torch.equal(ours, reference) and ours.is_contiguous()
    copies = {"cat", "stack", "copy_", "clone", "_to_copy", "contiguous"}
    assert sum(op in copies for op in our_ops) == 1, our_ops
    assert sum(op in copies for op in reference_ops) == 2, reference_ops  # what split_heads saves
