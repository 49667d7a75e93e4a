"""One fine-tuning run of `bertrain evaluate`: a pretrained encoder plus a new head trained on a task with one
seed (AdamW with pretraining's no-decay groups, linear warmup and decay, autocast), then scored on validation."""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from bertrain.batch_layout import map_tensors
from bertrain.config import OptimConfig
from bertrain.config.finetune import FinetuneConfig
from bertrain.data.task_batches import EncodedSplit, TaskBatch, collate
from bertrain.errors import Interrupted
from bertrain.model import PreTrainingModel
from bertrain.model.classifier import SequenceClassifier, should_pack
from bertrain.train.optim import build_optimizer, build_scheduler
from bertrain.train.precision import choose_mixed_precision
from bertrain.train.scores import score
from bertrain.train.signals import raise_if_interrupted, received_signal_name, stop_requested
from bertrain.train.step import clip_scale, global_norm, gradient_groups, takes_grad_scale
from bertrain.train.threads import ThreadPlan, ThreadTuner

ADAM_EPS = 1e-8  # transformers Trainer's default (Google's BERT: 1e-6); changes nothing measurable here


@dataclass
class TaskData:
    """A task's encoded examples and what scoring needs."""

    train: EncodedSplit
    validation: dict[str, EncodedSplit]
    metrics: tuple[str, ...]
    num_labels: int
    pad_token_id: int


@dataclass
class RunOutcome:
    """What one (task, seed) run gives: every metric on every validation split, and its speed."""

    scores: dict[str, float]    # "accuracy", or "accuracy_m" / "accuracy_mm" with several splits
    score: float                # the mean of `scores`: the task's number for this seed
    steps: int
    train_examples: int         # examples seen in training (steps x batch, the last batch of an epoch smaller)
    train_seconds: float
    eval_seconds: float
    constant: list[str] = field(default_factory=list)  # validation splits given one prediction for every example


def stopped_message(by: str) -> str:
    """What evaluate says when a signal (SIGTERM, Ctrl-C, ...) stops it: nothing finished is lost."""
    return (f"evaluate stopped by {by}: every finished (task, seed) is in results.json; run the same command to "
            "continue from there.")


def total_steps(examples: int, recipe: FinetuneConfig) -> int:
    """Optimizer steps of a run: epochs x batches per epoch (the last batch of an epoch may be smaller)."""
    return max(1, math.ceil(recipe.epochs * math.ceil(examples / recipe.batch_size)))


def autocast_dtype(recipe: FinetuneConfig, device: torch.device) -> torch.dtype | None:
    precision = choose_mixed_precision(recipe.mixed_precision, device)
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def _to(batch: TaskBatch, device: torch.device) -> TaskBatch:
    return batch if device.type == "cpu" else map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def _batches_of_epoch(examples: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng([seed, epoch]).permutation(examples)
    return [order[i:i + batch_size] for i in range(0, examples, batch_size)]


def finetune(pretrained: PreTrainingModel, data: TaskData, recipe: FinetuneConfig, seed: int, device: torch.device,
             on_step: Callable[[int, int], None] | None = None, threads: ThreadPlan | None = None,
             say: Callable[[str], None] | None = None) -> RunOutcome:
    """Fine-tune a copy of `pretrained` with `seed` (head initialization, dropout, data order) and score it.
    `on_step(done, total)` after each step; an auto `threads` plan is measured on the first batch (its choice
    `say`-d). A stop signal raises Interrupted (exit 75) between steps."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = SequenceClassifier(copy.deepcopy(pretrained), data.num_labels, generator).to(device)
    train = data.train
    if recipe.max_train_examples is not None and recipe.max_train_examples < len(train):
        train = _first(train, recipe.max_train_examples)
    steps = total_steps(len(train), recipe)
    optim = OptimConfig(name="adamw", lr=recipe.lr, weight_decay=recipe.weight_decay, eps=ADAM_EPS,
                        max_grad_norm=recipe.max_grad_norm, schedule="linear", warmup_fraction=recipe.warmup_fraction)
    optimizer = build_optimizer(model, optim, device)
    scheduler = build_scheduler(optimizer, optim, steps)
    dtype = autocast_dtype(recipe, device)
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    hidden, unpad = model.config.hidden_size, getattr(model.config, "unpad", "auto")
    # model.unpad's auto rule was measured on CPUs; a GPU's fine-tuning step packed is not measured yet: padded.
    pack_when = None if device.type != "cpu" and unpad == "auto" else (lambda share: should_pack(share, hidden, unpad))
    multiple_of = 8 if device.type == "cuda" else 1
    model.train()
    tuner, probing = None, 0.0  # finetune.threads: auto (measuring is not training time)
    groups = gradient_groups(model)  # listed once; clipping takes the norm of their gradients
    start, done, seen, epoch = time.perf_counter(), 0, 0, 0
    raise_if_interrupted()  # a Ctrl-C that Python swallowed while evaluate started
    while done < steps:
        for indices in _batches_of_epoch(len(train), recipe.batch_size, seed, epoch):
            if done == steps:
                break
            if stop_requested():
                raise Interrupted(stopped_message(received_signal_name()))
            batch = _to(collate(train, indices, data.pad_token_id, pack_when, multiple_of), device)
            if threads is not None and threads.auto:
                tuner = tuner or ThreadTuner(threads, model, None, vars(batch), run_pass=lambda part: _loss(
                    model, TaskBatch(**part), device, dtype).backward())
                if tuner.due():  # at the start and every RECHECK_SECONDS
                    began = time.perf_counter()
                    line = tuner.probe()
                    probing += time.perf_counter() - began
                    if line and say is not None:
                        say(line)
            loss = _loss(model, batch, device, dtype)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if recipe.max_grad_norm is not None and scaler is None and takes_grad_scale(optimizer):
                optimizer.grad_scale = clip_scale(global_norm(groups), recipe.max_grad_norm)
            elif recipe.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
                optimizer.__dict__.pop("grad_scale", None)
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            done, seen = done + 1, seen + len(indices)
            if on_step is not None:
                on_step(done, steps)
        epoch += 1
    trained = time.perf_counter()
    scores, constant = evaluate_splits(model, data, recipe, device, dtype, pack_when, multiple_of)
    return RunOutcome(scores, float(np.mean(list(scores.values()))), steps, seen, trained - start - probing,
                      time.perf_counter() - trained, constant)


def _loss(model: SequenceClassifier, batch: TaskBatch, device: torch.device, dtype: torch.dtype | None):
    """The training loss of one batch, in the run's autocast."""
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        return model(batch.input_ids, batch.attention_mask, batch.token_type_ids, batch.labels, batch.packing).loss


def _first(split: EncodedSplit, count: int) -> EncodedSplit:
    end = int(split.offsets[count - 1] + split.lengths[count - 1])
    return EncodedSplit(split.ids[:end], split.types[:end], split.offsets[:count], split.lengths[:count],
                        split.labels[:count], split.max_length)


@torch.no_grad()
def predict(model: SequenceClassifier, split: EncodedSplit, batch_size: int, pad_token_id: int, device: torch.device,
            dtype: torch.dtype | None = None, pack_when=None, multiple_of: int = 1) -> np.ndarray:
    """The model's outputs [N, labels] on a split, in the split's order (batches of similar length)."""
    model.eval()
    order = np.argsort(split.lengths, kind="stable")
    outputs = np.empty((len(split), model.num_labels), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        batch = _to(collate(split, indices, pad_token_id, pack_when, multiple_of), device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, packing=batch.packing).logits
        outputs[indices] = logits.float().cpu().numpy()
    return outputs


def evaluate_splits(model: SequenceClassifier, data: TaskData, recipe: FinetuneConfig, device: torch.device,
                    dtype: torch.dtype | None = None, pack_when=None,
                    multiple_of: int = 1) -> tuple[dict[str, float], list[str]]:
    """Every metric on every validation split ({metric} with one split, {metric}_{split} with several), and the
    splits where the model gave every example one prediction (a collapsed run: F1, MCC or correlation undefined)."""
    scores, constant = {}, []
    for name, split in data.validation.items():
        outputs = predict(model, split, recipe.eval_batch_size, data.pad_token_id, device, dtype, pack_when,
                          multiple_of)
        predictions = outputs.reshape(-1) if outputs.shape[-1] == 1 else outputs.argmax(-1)
        if len(predictions) > 1 and np.all(predictions == predictions[0]):
            constant.append(name)
        for metric in data.metrics:
            key = metric if len(data.validation) == 1 else f"{metric}_{name}"
            scores[key] = score(metric, outputs, split.labels)
    return scores, constant
