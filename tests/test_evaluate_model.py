"""The sequence classification head (bertrain evaluate) against transformers' Bert/AlbertForSequenceClassification."""

from __future__ import annotations

import pytest
import torch

from bertrain.batch_layout import pack_lengths
from bertrain.config import ModelConfig
from bertrain.model import build_model
from bertrain.model.classifier import SequenceClassifier
from bertrain.model.hf import hf_config
from bertrain.model.hf_classifier import classifier_hf_config, classifier_state_dict, export_classifier

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SMALL = dict(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=40, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0)


def small_classifier(kind: str, num_labels: int, seed: int = 0) -> SequenceClassifier:
    torch.manual_seed(seed)
    extra = dict(embedding_size=16, num_hidden_groups=2, inner_group_num=1, hidden_act="gelu_new") \
        if kind == "albert" else {}
    model = SequenceClassifier(build_model(ModelConfig(type=kind, **SMALL, **extra)), num_labels)
    with torch.no_grad():  # a non-zero head bias and pooler, so a mis-mapped tensor shows
        model.classifier.bias.normal_()
        model.pooler.bias.normal_()
    return model.eval()


def padded_inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([17, 5, 11, 2])
    ids = torch.randint(5, SMALL["vocab_size"], (4, 17), generator=generator)
    mask = (torch.arange(17)[None] < lengths[:, None]).long()
    types = ((torch.arange(17)[None] >= lengths[:, None] // 2) & mask.bool()).long()
    return ids * mask, mask, types


def transformers_twin(model: SequenceClassifier):
    config_dict = classifier_hf_config(model, None)
    config_class = transformers.AlbertConfig if model.config.type == "albert" else transformers.BertConfig
    config = config_class(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")})
    twin_class = (transformers.AlbertForSequenceClassification if model.config.type == "albert"
                  else transformers.BertForSequenceClassification)
    twin = twin_class(config).eval()
    missing, unexpected = twin.load_state_dict(classifier_state_dict(model), strict=False)
    assert not unexpected and all("position_ids" in name for name in missing), (missing, unexpected)
    return twin


@pytest.mark.parametrize("kind", ["bert", "albert"])
@pytest.mark.parametrize("num_labels", [1, 3])
def test_logits_equal_transformers_padded_and_packed(kind, num_labels):
    model = small_classifier(kind, num_labels)
    twin = transformers_twin(model)
    ids, mask, types = padded_inputs()
    with torch.no_grad():
        expected = twin(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        padded = model(ids, mask, types).logits
        packing, _ = pack_lengths(mask.sum(1).numpy(), ids.shape[1])
        packed = model(ids, mask, types, packing=packing).logits
    assert expected.shape == (4, num_labels)
    assert (padded - expected).abs().max() <= 1e-5
    assert (packed - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("num_labels", [1, 2])
def test_losses_are_transformers_losses(num_labels):
    model = small_classifier("bert", num_labels)
    twin = transformers_twin(model)
    ids, mask, types = padded_inputs()
    labels = torch.tensor([0.5, -1.0, 2.0, 0.0]) if num_labels == 1 else torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        ours = model(ids, mask, types, labels=labels).loss
        theirs = twin(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
    assert abs(float(ours) - float(theirs)) <= 1e-5


@pytest.mark.parametrize("num_labels", [1, 3])
def test_under_bf16_autocast_the_head_is_float32(num_labels):
    # Scores of a regression task came from bf16-rounded outputs: near values tied, a seed scored Pearson 0.0.
    model = small_classifier("bert", num_labels)
    ids, mask, types = padded_inputs()
    pooled = []
    model.pooler.register_forward_hook(lambda module, inputs, output: pooled.append(output))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids, mask, types).logits
    assert pooled[0].dtype == torch.bfloat16  # the encoder did run in bf16
    assert logits.dtype == torch.float32
    reference = torch.tanh(pooled[0]).float() @ model.classifier.weight.T + model.classifier.bias  # bf16 tanh, as run
    assert (logits - reference).abs().max() <= 1e-5


def test_head_shares_the_pretrained_encoder_and_starts_from_the_seed():
    pretrained = build_model(ModelConfig(type="bert", **SMALL))
    a = SequenceClassifier(pretrained, 2, torch.Generator().manual_seed(3))
    b = SequenceClassifier(pretrained, 2, torch.Generator().manual_seed(3))
    c = SequenceClassifier(pretrained, 2, torch.Generator().manual_seed(4))
    assert a.encoder is pretrained.encoder and a.pooler is pretrained.pooler
    assert torch.equal(a.classifier.weight, b.classifier.weight)
    assert not torch.equal(a.classifier.weight, c.classifier.weight)
    assert float(a.classifier.weight.detach().std()) == pytest.approx(0.02, rel=0.5)


@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_export_loads_with_auto_model_for_sequence_classification(kind, tmp_path):
    model = small_classifier(kind, 2)
    out = export_classifier(model, tmp_path / "export", labels=["no", "yes"])
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert loaded.config.id2label == {0: "no", 1: "yes"}
    assert type(loaded).__name__ == ("AlbertForSequenceClassification" if kind == "albert"
                                     else "BertForSequenceClassification")
    ids, mask, types = padded_inputs()
    with torch.no_grad():
        difference = (loaded(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
                      - model(ids, mask, types).logits).abs().max()
    assert difference <= 1e-5


def test_classifier_config_keeps_the_encoder_config():
    model = small_classifier("bert", 1)
    config = classifier_hf_config(model, None)
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "LABEL_0"}
    assert {k: v for k, v in config.items() if k in hf_config(model.config)} | {"architectures": None} == \
        {**hf_config(model.config), "architectures": None}


@pytest.mark.parametrize("pack", [False, True])
def test_batches_rounded_up_for_a_gpu_stay_within_the_position_table(pack):
    # On CUDA fine-tuning pads batches to a multiple of 8; a table of 38 positions has no row 39, so a batch whose
    # longest example fills it stays at 38, and one of 21 tokens becomes 24. Logits are those of unrounded batches.
    import numpy as np

    from bertrain.data.task_batches import EncodedSplit, collate

    torch.manual_seed(0)
    model = SequenceClassifier(build_model(ModelConfig(type="bert", **{**SMALL, "max_position_embeddings": 38})), 2)
    lengths = np.array([38, 21, 9])
    ids = np.random.default_rng(0).integers(5, SMALL["vocab_size"], int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    split = EncodedSplit(ids, np.zeros_like(ids), offsets, lengths, np.array([0, 1, 0]), max_length=38)
    model.eval()
    for indices, width in (([0, 1, 2], 38), ([1, 2], 24)):
        rounded, plain = (collate(split, np.array(indices), 0, (lambda share: pack) if pack else None, multiple)
                          for multiple in (8, 1))
        assert rounded.input_ids.shape[1] == width
        with torch.no_grad():
            logits = [model(b.input_ids, b.attention_mask, b.token_type_ids, packing=b.packing).logits
                      for b in (rounded, plain)]
        assert (logits[0] - logits[1]).abs().max() <= 1e-5
