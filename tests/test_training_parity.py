"""`bertrain pretrain`'s steps against transformers' Bert/AlbertForPreTraining trained by a hand-written loop."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import bertrain.train.loop as loop
from bertrain.batch_layout import IGNORE_INDEX
from bertrain.config import load_config
from bertrain.model import build_model
from bertrain.model.hf import to_hf_state_dict
from tests.helpers import TINY, rounding_rtol, write_config
from tests.reference_lamb import ReferenceLamb

STEPS, ACCUMULATION = 10, 2
# exclude_from_weight_decay of Google's BERT and ALBERT (optimization.py): no decay where a name holds one of these.
NO_DECAY = ("LayerNorm", "layer_norm", "bias")

# Every dropout 0 and fp32: both sides are deterministic functions of the weights and the batches. lr and weight
# decay are large enough that a decay on LayerNorm, or an lr one step off, moves weights far past the tolerance
# (measured: 28x and more); the clipping norm lies among the steps' gradient norms, so some steps are clipped, some not.
MODEL = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
         "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 64}
OPTIM = {"lr": 1.0e-2, "weight_decay": 0.1, "betas": [0.9, 0.98], "eps": 1.0e-6, "max_grad_norm": 1.5,
         "schedule": "linear", "warmup_steps": 3}
TRAIN = {"batch_size": 8, "gradient_accumulation_steps": ACCUMULATION, "max_steps": STEPS, "save_every": STEPS,
         "eval_every": 0, "log_every": 1, "mixed_precision": "no", "deterministic": True}
BERT_DATA = {"objective": "nsp", "masking": "token"}
ALBERT_DATA = {"objective": "sop", "masking": "ngram"}
ALBERT = {"type": "albert", "embedding_size": 16, "hidden_act": "gelu_new", **MODEL}  # one layer group, shared
ADAMW = {"name": "adamw"}
CASES = {
    # The padded encoder (its last layer pruned to [CLS] and the predicted rows) and the packed one.
    "bert-padded": {"data": BERT_DATA, "model": {"type": "bert", "unpad": "false", **MODEL}, "optim": ADAMW},
    "bert-packed": {"data": BERT_DATA, "model": {"type": "bert", "unpad": "true", **MODEL}, "optim": ADAMW},
    "albert": {"data": ALBERT_DATA, "model": ALBERT, "optim": ADAMW},
    "albert-lamb": {"data": ALBERT_DATA, "model": ALBERT, "optim": {"name": "lamb"}},
}
# LAMB scales each tensor's step by ||w|| / ||update||: bertrain holds query, key and value as one fused [3H, H]
# tensor (model/layers.py), transformers and Google's ALBERT as three with three ratios. bertrain's LAMB gave the
# fused tensor one ratio (27-56x the tolerance off in those weights after 10 steps); now each row block has its own.


def run_bertrain(run_cli, monkeypatch, tmp_path, data_dir, case: dict):
    """`bertrain pretrain` in this process; returns (resolved config, initial weights, the micro-batches of each
    step as train_step received them, the train records of metrics.jsonl, the final checkpoint's weights)."""
    initial, trained_on = {}, []
    build, train_step = loop.build_model, loop.train_step

    def recording_build(model_config, **options):
        model = build(model_config, **options)
        initial.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return model

    def recording_step(model, accelerator, batches, *args):
        trained_on.append([{k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)} for b in batches])
        return train_step(model, accelerator, batches, *args)

    # Only watched: the loop builds its model and runs each step with its own functions, unchanged.
    monkeypatch.setattr(loop, "build_model", recording_build)
    monkeypatch.setattr(loop, "train_step", recording_step)
    config_path = write_config(tmp_path / "parity.yaml", TINY, data=case["data"], model=case["model"],
                               optim={**OPTIM, **case["optim"]}, train=TRAIN)
    run_dir = tmp_path / "run"
    code, out, err = run_cli("pretrain", "--config", str(config_path), "--data", str(data_dir),
                             "--run-dir", str(run_dir))
    assert code == 0, out + err
    config = load_config(run_dir / "config.yaml")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = load_file(str(run_dir / "checkpoints" / f"step-{STEPS:08d}" / "model.safetensors"))
    return config, initial, trained_on, [r for r in records if r["kind"] == "train"], final


def as_hf(model_config, state: dict) -> dict:
    """bertrain weights under transformers' names (hf.py's mapping: a wrong one shows as a loss at step 1)."""
    model = build_model(model_config)
    model.load_state_dict(state)
    return to_hf_state_dict(model)


def reference_model(model_config, initial: dict):
    """transformers' model of the config's shape holding bertrain's initial weights; eager attention, the plainest."""
    import transformers

    c = model_config
    shape = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
                 num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
                 hidden_act=c.hidden_act, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
                 layer_norm_eps=c.layer_norm_eps, tie_word_embeddings=True)
    if c.type == "albert":
        config = transformers.AlbertConfig(embedding_size=c.embedding_size, num_hidden_groups=c.num_hidden_groups,
                                           inner_group_num=c.inner_group_num, classifier_dropout_prob=0.0, **shape)
        model = transformers.AlbertForPreTraining._from_config(config, attn_implementation="eager")
        decoder, words = model.predictions.decoder, model.albert.embeddings.word_embeddings
    else:
        model = transformers.BertForPreTraining._from_config(transformers.BertConfig(**shape),
                                                             attn_implementation="eager")
        decoder, words = model.cls.predictions.decoder, model.bert.embeddings.word_embeddings
    missing, unexpected = model.load_state_dict(as_hf(c, initial), strict=False)
    # Only the tied decoder (the word embeddings and the MLM bias) is left out of the file, as transformers does.
    assert not unexpected and {name.split(".")[-2] for name in missing} <= {"decoder"}, (missing, unexpected)
    assert decoder.weight is words.weight
    return model.train()


def sentence_logits(out) -> torch.Tensor:
    """The NSP (BERT) or SOP (ALBERT) head's logits [B, 2]."""
    return out.sop_logits if hasattr(out, "sop_logits") else out.seq_relationship_logits


def reference_training(model, steps: list[list[dict]], optim) -> list[dict]:
    """Google's BERT / ALBERT recipe from torch and transformers parts; each step's lr, losses, gradient norm."""
    from transformers import get_linear_schedule_with_warmup

    named = list(model.named_parameters())  # the tied decoder once, as the word embeddings
    exempt = [any(part in name for part in NO_DECAY) for name, _ in named]
    # Google's LAMB exempts from layer adaptation (the trust ratio) what it exempts from weight decay.
    groups = [{"params": [p for (_, p), e in zip(named, exempt) if not e], "weight_decay": optim.weight_decay},
              {"params": [p for (_, p), e in zip(named, exempt) if e], "weight_decay": 0.0, "layer_adaptation": False}]
    if optim.name == "lamb":
        optimizer = ReferenceLamb(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps)
    else:
        optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, foreach=False)
    scheduler = get_linear_schedule_with_warmup(optimizer, optim.warmup_steps, len(steps))
    history = []
    for micro_batches in steps:
        # A step's loss is that of one batch made of all its micro-batches: MLM cross-entropy averaged over every
        # predicted token of the step, the sentence task's over every labelled instance, as Google's BERT (which
        # does not accumulate) averages over its one batch. The mean of the micro-batches' means would weigh a
        # token by 1 / its micro-batch's count, and accumulating would no longer equal the big batch; so each
        # micro-batch's means, as transformers computes them, weigh by its share of the step's counts.
        counts = [(int((b["labels"] != IGNORE_INDEX).sum()), int((b["sentence_label"] != IGNORE_INDEX).sum()))
                  for b in micro_batches]
        predicted, labelled = (sum(column) for column in zip(*counts))
        record = {"lr": scheduler.get_last_lr()[0], "mlm_loss": 0.0, "sentence_loss": 0.0}
        for batch, (n, m) in zip(micro_batches, counts):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"])
            # transformers' pretraining losses: CrossEntropyLoss() (the mean, ignoring -100) of each task.
            mlm = F.cross_entropy(out.prediction_logits.view(-1, model.config.vocab_size), batch["labels"].view(-1))
            loss = mlm * (n / predicted)
            record["mlm_loss"] += loss.item()
            if m:  # no sentence term in a micro-batch of MLM-only instances (its mean would be 0 / 0)
                sentence = F.cross_entropy(sentence_logits(out).view(-1, 2), batch["sentence_label"].view(-1))
                loss = loss + sentence * (m / labelled)
                record["sentence_loss"] += sentence.item() * (m / labelled)
            loss.backward()
        record["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.max_grad_norm).item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        history.append(record)
    return history


def check_transformers_loss(model, batch: dict) -> None:
    """transformers' own loss of a micro-batch is the sum of the two means reference_training weighs."""
    label = "sentence_order_label" if "Albert" in type(model).__name__ else "next_sentence_label"
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"], labels=batch["labels"], **{label: batch["sentence_label"]})
        mlm = F.cross_entropy(out.prediction_logits.view(-1, model.config.vocab_size), batch["labels"].view(-1))
        sentence = F.cross_entropy(sentence_logits(out).view(-1, 2), batch["sentence_label"].view(-1))
    assert torch.equal(out.loss, mlm + sentence)


def step_mismatches(records: list[dict], history: list[dict], K: int, elements: int, layers: int) -> list[str]:
    """Each step's losses and gradient norm beyond rounding: K is the longest reduction of a forward and backward
    (the vocabulary's softmax, or a weight gradient's sum over a micro-batch's tokens), each of the L layers adds
    its rounding (as tests/test_model.py counts one forward), and each optimizer step carries all of it forward:
    step s, L * s stages. The gradient norm sums the squares of every gradient element: K = their count."""
    mismatches = []
    for record, expected in zip(records, history):
        s = record["step"]
        for key, k in (("mlm_loss", K), ("sentence_loss", K), ("grad_norm", elements)):
            error = abs(record[key] - expected[key]) / abs(expected[key])
            rtol = rounding_rtol(k, layers * s)
            if not error <= rtol:  # NaN included
                mismatches.append(f"{key} of step {s}: {record[key]:.9g} vs {expected[key]:.9g}, "
                                  f"{error:.3g} > {rtol:.3g}")
    return mismatches


def weight_mismatches(final: dict, reference: dict, rtol: float, reach: float, lamb: bool) -> list[tuple[float, str]]:
    """(error / bound, description) of each tensor beyond rounding, worst first. An AdamW step moves a weight by at
    most about lr (its direction m̂ / (√v̂ + ε) is at most about 1 an element), a LAMB step moves a tensor by
    lr * ||w||: a weight's rounding is relative to its magnitude plus that reach (`reach`: the sum of the steps'
    lr). The attention key bias, whose true gradient is 0 (softmax ignores a shift shared by all keys), is nothing
    but rounding of that size."""
    mismatches = []
    for name, weight in final.items():
        expected = reference[name]
        bound = rtol * (float(expected.abs().max()) + reach * (max(1.0, float(expected.norm())) if lamb else 1.0))
        error = float((weight - expected).abs().max())
        if not error <= bound:  # NaN included
            mismatches.append((error / bound, f"{name}: {error:.3g} > {bound:.3g} ({error / bound:.3g}x)"))
    return sorted(mismatches, key=lambda m: -m[0] if math.isfinite(m[0]) else -math.inf)


@pytest.mark.cross_path
@pytest.mark.parametrize("case", list(CASES))
def test_pretrain_steps_match_transformers_with_torch_optimizer_schedule_and_clipping(
        case, run_cli, monkeypatch, tmp_path, tiny_data, fresh_accelerate):
    config, initial, trained_on, records, final = run_bertrain(run_cli, monkeypatch, tmp_path, tiny_data, CASES[case])
    assert [len(step) for step in trained_on] == [ACCUMULATION] * STEPS
    model = reference_model(config.model, initial)
    check_transformers_loss(model, trained_on[0][0])
    history = reference_training(model, trained_on, config.optim)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # The same float64 formula on both sides: a step off shows as a whole lr / warmup_steps or more.
    assert [r["lr"] for r in records] == pytest.approx([h["lr"] for h in history], rel=1e-12, abs=1e-15)
    clipped = [h["grad_norm"] > config.optim.max_grad_norm for h in history]
    assert any(clipped) and not all(clipped), [h["grad_norm"] for h in history]

    layers = config.model.num_hidden_layers
    K = max(config.model.vocab_size, max(b["input_ids"].numel() for step in trained_on for b in step))
    steps = step_mismatches(records, history, K, sum(p.numel() for p in model.parameters()), layers)
    weights = weight_mismatches(as_hf(config.model, final), model.state_dict(), rounding_rtol(K, layers * STEPS),
                                reach=sum(h["lr"] for h in history), lamb=config.optim.name == "lamb")
    summary = f"{len(steps)} step values off: {'; '.join(steps[:4])}. {len(weights)} weight tensors off after " \
              f"{STEPS} steps, worst first: {'; '.join(text for _, text in weights[:6])}"
    assert not steps and not weights, summary
