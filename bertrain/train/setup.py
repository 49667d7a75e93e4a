"""Setting up a run: the config resolved against its data, Accelerate, the schedule length, RUN_DIR's files."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from rich.console import Console

from bertrain import rundir
from bertrain.config import Config, TrainConfig, dump_yaml
from bertrain.data.format import PreparedData, open_prepared
from bertrain.data.loader import epoch_tokens
from bertrain.errors import ConfigError
from bertrain.model import compile_layers
from bertrain.model.hf import write_tokenizer_files
from bertrain.train.checkpoint import TrainState
from bertrain.train.monitor import truncate_metrics
from bertrain.train.precision import choose_mixed_precision, local_device_type, set_tf32


def resolve_run_config(config: Config, data_dir: str | None, run_dir: str | None) -> tuple[Config, PreparedData]:
    """(`config` with --data / --run-dir and the data's vocab_size, that data); refuses a misfit."""
    if data_dir:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, path=str(data_dir)))
    if run_dir:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, output_dir=str(run_dir)))
    prepared = open_prepared(config.data.path)
    vocab = prepared.vocab_size
    if config.model.vocab_size is None:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=vocab))
    elif config.model.vocab_size < vocab:
        raise ConfigError(
            f"Config key 'model.vocab_size' ({config.model.vocab_size}) is smaller than the tokenizer's vocabulary "
            f"({vocab}, from {prepared.path}/manifest.json): token ids would fall outside the embedding. "
            f"Remove model.vocab_size (it is taken from the manifest) or set it to at least {vocab}.")
    if config.data.masking in ("whole_word", "ngram") and prepared.tokenizer_kind not in ("wordpiece", "unigram"):
        raise ConfigError(
            f"Config key 'data.masking' is {config.data.masking!r}, which needs word boundaries, but the tokenizer "
            f"kind in {prepared.path}/manifest.json is {prepared.tokenizer_kind!r} (known: wordpiece, unigram). "
            f"Use data.masking=token or prepare the data with a wordpiece/unigram tokenizer.")
    return config, prepared


def build_accelerator(train: TrainConfig) -> Accelerator:
    """Accelerate for this process, with `train.mixed_precision` resolved and `train.tf32` applied."""
    device_type = local_device_type()
    mixed_precision = choose_mixed_precision(train.mixed_precision, device_type)
    set_tf32(train.tf32)
    try:
        # Without an accelerator device, Accelerate only sees torchrun's/launch's ranks when told cpu=True.
        return Accelerator(mixed_precision=mixed_precision, cpu=device_type == "cpu")
    except (ValueError, RuntimeError) as error:
        raise ConfigError(f"Config key 'train.mixed_precision' ({train.mixed_precision!r}, here {mixed_precision!r}) "
                          f"is not usable here: {error}") from None


# `train.compile: auto` compiles runs at least this long: compiling takes 10-20 s, and on an H200 the compiled
# step saved 1 ms (bert_base, its loop host-bound outside the model) to 13 ms (bert_large) at seq 128
COMPILE_MIN_STEPS = 5000


def choose_compile(train: TrainConfig, device: torch.device, total_steps: int) -> tuple[bool, str]:
    """Whether `train.compile` compiles the encoder layers of a run of `total_steps` on `device`, and why."""
    if train.compile != "auto":
        return bool(train.compile), f"train.compile is {str(train.compile).lower()}"
    if device.type != "cuda":
        return False, f"train.compile auto: off on {device.type}"
    if train.deterministic:
        return False, "train.compile auto: off with train.deterministic"
    if importlib.util.find_spec("triton") is None or torch.cuda.get_device_capability(device) < (7, 0):
        return False, "train.compile auto: off, as torch.compile's GPU code needs Triton and compute capability 7.0+"
    if total_steps < COMPILE_MIN_STEPS:
        return False, f"train.compile auto: off for {total_steps:,} steps (compiles {COMPILE_MIN_STEPS:,} or more)"
    return True, f"train.compile auto: {total_steps:,} steps on a CUDA GPU"


def compile_if_chosen(model, train: TrainConfig, accelerator: Accelerator, total_steps: int, console: Console) -> bool:
    """compile_layers(model) where choose_compile says so, saying so on the main process; whether it did."""
    chosen, why = choose_compile(train, accelerator.device, total_steps)
    if not chosen:
        return False
    if train.compile == "auto":  # a run that did not ask for compiling runs eager where compiling fails
        torch._dynamo.config.suppress_errors = True
    compile_layers(model)
    if accelerator.is_main_process:
        console.print(f"torch.compile: the encoder layers are compiled ({why}), so the first step takes 10-20 s "
                      f"longer; train.compile=false runs eager.", highlight=False)
    return True


def schedule_length(config: Config, prepared: PreparedData, epoch_length: int, micro_batch_size: int,
                    world_size: int) -> int:
    """Length of the lr schedule: max_steps, or max_tokens over the tokens per step of the first epoch's plan."""
    train = config.train
    if train.max_tokens is None:
        return int(train.max_steps)
    tokens_per_epoch = max(1, epoch_tokens(prepared, config.data, seed=train.seed, epoch=0,
                                           instances=epoch_length * micro_batch_size * world_size))
    steps_per_epoch = max(epoch_length / train.gradient_accumulation_steps, 1e-9)
    return max(1, math.ceil(train.max_tokens / (tokens_per_epoch / steps_per_epoch)))


def write_run_files(run_dir: Path, config: Config, prepared: PreparedData, state: TrainState, resume_path: Path | None,
                    console: Console) -> None:
    """RUN_DIR's config, tokenizer copy and metrics (cut back to the resumed step); rank 0 calls it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / rundir.CONFIG).write_text(dump_yaml(config))
    tokenizer_copy = run_dir / rundir.TOKENIZER
    if prepared.tokenizer_dir.is_dir():
        shutil.rmtree(tokenizer_copy, ignore_errors=True)
        tokenizer_copy.mkdir()
        # As an export writes it: model_max_length is the model's positions (transformers truncates to it).
        write_tokenizer_files(prepared.tokenizer_dir, tokenizer_copy, config.model.max_position_embeddings)
    dropped = truncate_metrics(run_dir, state.step)
    if resume_path is not None:
        console.print(f"Resuming from {resume_path} (step {state.step}, epoch {state.epoch}, "
                      f"micro-batch {state.micro_batch})"
                      + (f"; dropped {dropped} metric records written after it" if dropped else ""), highlight=False)

