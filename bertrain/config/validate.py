"""Config validation: the cross-field rules that types cannot express and that need only the config's values."""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from bertrain.config.schema import Config, DataConfig, ModelConfig, OptimConfig, Recipe, TrainConfig
from bertrain.config.yaml_tree import flatten
from bertrain.errors import ConfigError


class ConfigWarning(UserWarning):
    """A config that runs but probably not as meant (the CLI prints it as `Warning: ...`)."""


_POSITIVE_MODEL_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                        "max_position_embeddings", "num_hidden_groups", "inner_group_num")
SEEDS = 2 ** 32  # numpy's and torch's seeds are below it


def validate(config: Any) -> None:
    """Cross-field checks of a config or recipe: ConfigError naming the key, or a ConfigWarning once."""
    for key, value in flatten(dataclasses.asdict(config), lists=True).items():  # `optim.lr=inf` ran before
        _require(not isinstance(value, float) or math.isfinite(value), key, "a finite number", value)
    if isinstance(config, Config):
        validate_model(config.model)
        _validate_data(config.data, config.model)
        _validate_train(config.train)
        _validate_optim(config.optim)
        for message in config_warnings(config):
            warnings.warn(message, ConfigWarning, stacklevel=2)
    if isinstance(config, Recipe):
        _validate_recipe(config)


def _require(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"Config key '{key}' must be {rule}, got {value!r}.")


def _in_unit_interval(value: float, key: str, include_one: bool = False) -> None:
    _require(0 <= value <= 1 if include_one else 0 <= value < 1, key, "in [0, 1]" if include_one else "in [0, 1)",
             value)


def validate_model(model: ModelConfig) -> None:
    """The model section: positive sizes (vocab_size may be null), heads dividing hidden_size, groups layers."""
    if model.vocab_size is not None and model.vocab_size < 1:
        raise ConfigError(f"model.vocab_size must be at least 1, got {model.vocab_size}.")
    for key in _POSITIVE_MODEL_KEYS:
        if getattr(model, key) < 1:  # checked first: the divisibility checks below divide by them
            raise ConfigError(f"model.{key} must be at least 1, got {getattr(model, key)}.")
    # A pair's segment B has type id 1: one type made the embedding lookup fail at the first batch (IndexError).
    _require(model.type_vocab_size >= 2, "model.type_vocab_size", "at least 2 (segments A and B)",
             model.type_vocab_size)
    if model.hidden_size % model.num_attention_heads:
        raise ConfigError(
            f"model.hidden_size ({model.hidden_size}) must be divisible by model.num_attention_heads "
            f"({model.num_attention_heads}).")
    if model.type == "albert" and model.num_hidden_layers % model.num_hidden_groups:
        raise ConfigError("model.num_hidden_layers must be divisible by model.num_hidden_groups.")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        _in_unit_interval(getattr(model, key), f"model.{key}")
    _require(model.initializer_range > 0, "model.initializer_range", "positive", model.initializer_range)
    _require(model.layer_norm_eps > 0, "model.layer_norm_eps", "positive", model.layer_norm_eps)
    if model.embedding_size is not None:
        _require(model.embedding_size >= 1, "model.embedding_size", "at least 1", model.embedding_size)


def _validate_data(data: DataConfig, model: ModelConfig) -> None:
    if data.max_seq_length > model.max_position_embeddings:
        raise ConfigError(
            f"data.max_seq_length ({data.max_seq_length}) exceeds model.max_position_embeddings "
            f"({model.max_position_embeddings}).")
    if not 0 < data.mlm_probability < 1:
        raise ConfigError(f"data.mlm_probability must be in (0, 1), got {data.mlm_probability}.")
    if data.mask_prob + data.random_prob > 1:
        raise ConfigError("data.mask_prob + data.random_prob must not exceed 1.")
    if data.max_seq_length < 8:
        raise ConfigError("data.max_seq_length must be at least 8.")
    for key in ("short_seq_prob", "mask_prob", "random_prob"):
        _in_unit_interval(getattr(data, key), f"data.{key}", include_one=True)
    for key in ("ngram_max", "pad_to_multiple_of"):
        _require(getattr(data, key) >= 1, f"data.{key}", "at least 1", getattr(data, key))
    if data.num_workers != "auto":
        _require(data.num_workers >= 0, "data.num_workers", "0 or more, or auto", data.num_workers)
    _require(data.eval_batches >= 0, "data.eval_batches", "0 or more", data.eval_batches)
    if data.max_predictions_per_seq is not None:
        _require(data.max_predictions_per_seq >= 1, "data.max_predictions_per_seq", "at least 1 (or null: no cap)",
                 data.max_predictions_per_seq)


def _validate_train(train: TrainConfig) -> None:
    if train.batch_size < 1 or train.gradient_accumulation_steps < 1:
        raise ConfigError("train.batch_size and train.gradient_accumulation_steps must be positive.")
    if train.batch_size % train.gradient_accumulation_steps:
        raise ConfigError(
            f"train.batch_size ({train.batch_size}) must be divisible by train.gradient_accumulation_steps "
            f"({train.gradient_accumulation_steps}).")
    if train.max_steps is None and train.max_tokens is None:
        raise ConfigError("Set a budget: train.max_steps or train.max_tokens.")
    _require(train.output_dir.strip() != "", "train.output_dir", "a directory such as runs/my-run (`.` for this one)",
             train.output_dir)  # empty wrote checkpoints and metrics into whatever the current directory was
    _require(0 <= train.seed < SEEDS, "train.seed", f"in [0, {SEEDS - 1}]", train.seed)
    for key in ("max_steps", "max_tokens", "stop_at_step"):  # 0 "finished" at once and saved nothing
        value = getattr(train, key)
        _require(value is None or value >= 1, f"train.{key}", "at least 1 (or null)", value)
    for key in ("save_every", "log_every", "keep_last", "max_bad_steps"):
        _require(getattr(train, key) >= 1, f"train.{key}", "at least 1", getattr(train, key))
    _require(train.eval_every >= 0, "train.eval_every", "0 (never) or more", train.eval_every)
    if train.threads != "auto":
        _require(train.threads >= 1, "train.threads", "at least 1, or auto", train.threads)
    _require(1 <= train.requeue_exit_code <= 255, "train.requeue_exit_code", "an exit code from 1 to 255",
             train.requeue_exit_code)


def _validate_optim(optim: OptimConfig) -> None:
    if len(optim.betas) != 2:
        raise ConfigError("optim.betas must be a list of two numbers, e.g. [0.9, 0.999].")
    for index, beta in enumerate(optim.betas):
        _in_unit_interval(beta, f"optim.betas[{index}]")
    if optim.warmup_fraction is not None and not 0 <= optim.warmup_fraction < 1:
        raise ConfigError("optim.warmup_fraction must be in [0, 1).")
    _require(optim.lr > 0, "optim.lr", "positive (the peak learning rate, e.g. 1e-4)", optim.lr)
    _require(optim.eps > 0, "optim.eps", "positive", optim.eps)
    _require(optim.weight_decay >= 0, "optim.weight_decay", "0 or more", optim.weight_decay)
    _require(optim.warmup_steps >= 0, "optim.warmup_steps", "0 or more", optim.warmup_steps)
    if optim.max_grad_norm is not None:
        _require(optim.max_grad_norm > 0, "optim.max_grad_norm", "positive (or null: no clipping)", optim.max_grad_norm)


def config_warnings(config: Config) -> list[str]:
    """What in a valid config runs but is probably a mistake (the figures included)."""
    found = []
    optim, train = config.optim, config.train
    if optim.warmup_fraction is None and train.max_tokens is None and train.max_steps is not None \
            and optim.warmup_steps > train.max_steps:
        found.append(
            f"optim.warmup_steps ({optim.warmup_steps}) is longer than the run (train.max_steps {train.max_steps}): "
            f"the learning rate never reaches optim.lr ({optim.lr:g}); the run ends at "
            f"{optim.lr * train.max_steps / optim.warmup_steps:.3g}. Lower optim.warmup_steps or set "
            f"optim.warmup_fraction (e.g. 0.1).")
    return found


def check_precision_for_device(mixed_precision: str, device_type: str) -> None:
    """Refuse `train.mixed_precision: fp16` on a CPU (fp16 autocast with a loss scaler is CUDA only)."""
    if mixed_precision == "fp16" and device_type == "cpu":
        raise ConfigError(
            "Config key 'train.mixed_precision' is 'fp16', but this run is on the CPU: fp16 autocast with a loss "
            "scaler needs a CUDA GPU. Use 'auto' (bf16 where the CPU has native bf16, else fp32), 'bf16' or 'no'.")


def _validate_recipe(recipe: Recipe) -> None:
    if not 0 <= recipe.prepare.validation_fraction < 1:
        raise ConfigError("prepare.validation_fraction must be in [0, 1).")
    if recipe.prepare.num_shards < 1 or recipe.prepare.workers < 1:
        raise ConfigError("prepare.num_shards and prepare.workers must be at least 1.")
    for key in ("max_line_chars", "min_sentence_chars", "max_document_chars"):  # 0 crashed in range() at reading
        _require(getattr(recipe.prepare, key) >= 1, f"prepare.{key}", "at least 1", getattr(recipe.prepare, key))
    for index, source in enumerate(recipe.prepare.sources):  # 0 read every document
        _require(source.max_documents is None or source.max_documents >= 1, f"prepare.sources.{index}.max_documents",
                 "at least 1 (or null: all)", source.max_documents)
    tokenizer = recipe.tokenizer
    _require(tokenizer.min_frequency >= 0, "tokenizer.min_frequency", "at least 0", tokenizer.min_frequency)
    _require(tokenizer.max_bytes >= 1, "tokenizer.max_bytes", "at least 1", tokenizer.max_bytes)
    language = recipe.prepare.sentence_language
    _require(language is None or (isinstance(language, str) and language.isalpha() and language.islower()
                                  and 2 <= len(language) <= 3),
             "prepare.sentence_language", "null or an ISO 639 code such as de or th", language)


def micro_batch_size_for(config: Config, world_size: int) -> int:
    """Sequences per process per micro-batch: batch_size / (world_size * gradient_accumulation_steps)."""
    batch, accumulation = config.train.batch_size, config.train.gradient_accumulation_steps
    if batch % (world_size * accumulation):
        raise ConfigError(
            f"Config key 'train.batch_size' ({batch}) must be divisible by processes x "
            f"train.gradient_accumulation_steps ({world_size} x {accumulation} = {world_size * accumulation}). "
            f"Change the batch size, the accumulation steps or the number of processes.")
    return batch // (world_size * accumulation)


def fit_micro_batch_size(instances: int, micro_batch_size: int, world_size: int = 1) -> int:
    """`micro_batch_size`, or for a split smaller than one global micro-batch each rank's share (at least 1)."""
    return max(1, min(micro_batch_size, instances // world_size))
