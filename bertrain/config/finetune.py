"""`bertrain evaluate`'s keys: the fine-tuning recipe (`--set finetune.KEY=VALUE`) and a user task's YAML file.
Defaults: transformers' run_glue README recipe (lr 2e-5, batch 32, 3 epochs, max length 128) with the warmup and
weight decay of Google's BERT run_classifier.py (10%, 0.01); GLUE tasks change epochs and seeds (data/tasks.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from bertrain.config.schema import opt
from bertrain.config.overrides import parse_override, set_dotted
from bertrain.config.yaml_tree import build_dataclass
from bertrain.errors import ConfigError


@dataclass
class FinetuneConfig:
    """The recipe of each (task, seed) fine-tuning run. Defaults, then a GLUE task's changes (MRPC and WNLI: 5 epochs;
    MNLI and QQP: 3 seeds) or a task file's `finetune:` section, then `--set finetune.KEY=VALUE`."""

    lr: float = opt(2e-5, "Peak learning rate of AdamW (transformers' run_glue README: 2e-5).",
                    aliases=("learning_rate",))
    batch_size: int = opt(32, "Training examples per optimizer step.", aliases=("train_batch_size",))
    epochs: float = opt(3.0, "Passes over the training set (run_glue: 3; 5 on MRPC and WNLI).",
                        aliases=("num_train_epochs",))
    warmup_fraction: float = opt(0.1, "Linear warmup over this fraction of the steps, then linear decay to 0 "
                                      "(Google's run_classifier.py warmup_proportion).")
    weight_decay: float = opt(0.01, "AdamW decoupled weight decay, none on biases and LayerNorm (as pretraining).")
    max_grad_norm: Optional[float] = opt(1.0, "Clip the gradient norm to this (null: no clipping).")
    max_seq_length: int = opt(128, "Longer examples are truncated, longest text first; batches are padded to their "
                                   "longest example only.", aliases=("max_length",))
    seeds: int = opt(5, "Fine-tuning runs per task, seeds 1..N (`--seeds`); GLUE's MNLI and QQP default to 3.")
    eval_batch_size: int = opt(128, "Validation examples per forward pass.")
    max_train_examples: Optional[int] = opt(None, "Fine-tune on the first N training examples only (null: all); "
                                                   "for a quick look, not for reported scores.")
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = opt(
        "auto", "As train.mixed_precision: bf16 where the device computes it natively, fp16 on older GPUs, else "
        "fp32.")
    threads: Union[int, Literal["auto"]] = opt(
        "auto", "As train.threads: intra-op CPU threads of fine-tuning. `auto` (default): on a CPU, one training "
        "step's forward + backward is timed at torch's default count and at fewer threads at the start of each "
        "run and every 2 minutes, and the fastest is used (the default unless another is over 15% faster); left "
        "alone on a GPU, under `bertrain launch` and where OMP_NUM_THREADS is set. A number sets it (the count "
        "changes float rounding: set one for bit-identical reruns on a busy machine). Not part of the recipe: a "
        "change continues an evaluation.")


@dataclass
class EvaluateConfig:
    """What `bertrain evaluate --set` reaches."""

    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)


@dataclass
class TaskFile:
    """A task of your own for `bertrain evaluate --tasks FILE.yaml` (paths relative to the YAML file)."""

    name: str = opt("", "The task's name in tables and results.json.")
    train: str = opt("", "Training examples: a .jsonl, .csv, .tsv or .parquet file.")
    validation: str = opt("", "Validation examples (scored), same formats.")
    text: Union[list[str], str] = opt([], "One or two text columns, e.g. `[sentence1, sentence2]`.")
    label: str = opt("label", "The label column.")
    kind: Literal["classification", "regression"] = opt(
        "classification", "`classification` (labels are names or integers) or `regression` (numbers).")
    metric: Literal["accuracy", "f1", "matthews", "pearson_spearman"] = opt(
        "accuracy", "The score: accuracy, f1 (of the positive label: `positive_label`, else `1`, `true` or the "
        "larger of two), matthews (correlation), pearson_spearman (their mean; regression).")
    positive_label: Union[str, bool, int, None] = opt(
        None, "With `metric: f1`: the label whose F1 is scored (e.g. `duplicate`, which is not the larger of "
        "`duplicate` / `not_duplicate`); unset: `1`, `true` or the larger of the two.")
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)


def finetune_config(base: dict, overrides: list[str], seeds: int | None = None) -> FinetuneConfig:
    """The recipe: FinetuneConfig defaults, then `base` (a task's changes), then `--set finetune.KEY=VALUE`."""
    tree = {"finetune": dict(base)}
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(tree, key, value, EvaluateConfig)
    config = build_dataclass(EvaluateConfig, tree).finetune
    if seeds is not None:
        config.seeds = seeds
    validate_finetune(config)
    return config


def validate_finetune(config: FinetuneConfig) -> None:
    """Refuse values no run can use, naming the key."""
    checks = (("lr", config.lr > 0, "positive"), ("batch_size", config.batch_size >= 1, "at least 1"),
              ("epochs", config.epochs > 0, "positive"), ("warmup_fraction", 0 <= config.warmup_fraction < 1,
                                                          "in [0, 1)"),
              ("weight_decay", config.weight_decay >= 0, "zero or more"),
              ("max_seq_length", config.max_seq_length >= 3, "at least 3 ([CLS] x [SEP])"),
              ("seeds", config.seeds >= 1, "at least 1"), ("eval_batch_size", config.eval_batch_size >= 1,
                                                             "at least 1"),
              ("max_train_examples", config.max_train_examples is None or config.max_train_examples >= 1,
               "at least 1 or null"), ("threads", config.threads == "auto" or config.threads >= 1,
                                       "at least 1, or auto"))
    for key, ok, rule in checks:
        if not ok:
            raise ConfigError(f"Config key 'finetune.{key}' must be {rule}, got {getattr(config, key)!r}.")
